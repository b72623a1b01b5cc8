//! Counters of what the engine did, for users and tests: cycles, cache
//! hits, and how many tensors each fused operation carried.

use std::collections::BTreeMap;

/// A snapshot of one rank's engine counters ([`crate::Kolo::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Negotiation cycles run.
    pub cycles: u64,
    /// Cycles run on a caller's thread while it waited for its results,
    /// instead of on the background thread (host engines on a `Send`
    /// backend, see [`crate::Kolo::start`]).
    pub caller_cycles: u64,
    /// Cycles in which request lists were gathered to rank 0 (the others
    /// were settled by the response cache or were idle).
    pub gathered_cycles: u64,
    /// Responses that came from the response cache.
    pub cache_hits: u64,
    /// Data-plane operations performed (a fused operation counts once).
    pub operations: u64,
    /// Tensors completed by those operations.
    pub tensors: u64,
    /// Operations that carried more than one tensor.
    pub fused_operations: u64,
    /// Operations run straight over one whole submission's memory: a
    /// repeated group (a [`crate::TensorGroup`] step) reduced as one
    /// collective without taking its tensors apart, the engine's fast
    /// path (never with a timeline, which records every tensor).
    pub whole_operations: u64,
    /// Tensors failed by an error response (mismatch, stall, ...).
    pub failed_tensors: u64,
    /// Histogram: tensors carried by one operation -> number of operations.
    pub tensors_per_operation: BTreeMap<usize, u64>,
    /// Bytes the host fusion buffers held at the last operation (they
    /// stay within twice the fusion threshold; see kolo-fusion's
    /// `FusionBuffers`).
    pub fusion_buffer_bytes: u64,
}

impl Stats {
    /// Counts one negotiation cycle: whether it gathered request lists to
    /// rank 0, and how many responses the cache settled.
    pub(crate) fn record_cycle(&mut self, gathered: bool, cache_hits: usize) {
        self.cycles += 1;
        self.gathered_cycles += u64::from(gathered);
        self.cache_hits += cache_hits as u64;
    }

    /// Counts one data-plane operation that carried `tensors` tensors.
    pub(crate) fn record_operation(&mut self, tensors: usize) {
        self.operations += 1;
        self.tensors += tensors as u64;
        if tensors > 1 {
            self.fused_operations += 1;
        }
        *self.tensors_per_operation.entry(tensors).or_default() += 1;
    }

    /// Mean tensors per operation (0 before the first operation).
    pub fn mean_tensors_per_operation(&self) -> f64 {
        if self.operations == 0 {
            0.0
        } else {
            self.tensors as f64 / self.operations as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cycles_count_what_they_gathered_and_settled() {
        let mut stats = Stats::default();
        stats.record_cycle(true, 3);
        stats.record_cycle(false, 2);
        stats.record_cycle(false, 0);
        assert_eq!(
            (stats.cycles, stats.gathered_cycles, stats.cache_hits),
            (3, 1, 5)
        );
    }

    proptest! {
        #[test]
        fn the_histogram_adds_up(ops in proptest::collection::vec(1usize..20, 0..50)) {
            let mut stats = Stats::default();
            for &n in &ops {
                stats.record_operation(n);
            }
            prop_assert_eq!(stats.operations, ops.len() as u64);
            prop_assert_eq!(stats.tensors, ops.iter().sum::<usize>() as u64);
            prop_assert_eq!(stats.tensors_per_operation.values().sum::<u64>(), ops.len() as u64);
            prop_assert_eq!(stats.fused_operations, ops.iter().filter(|&&n| n > 1).count() as u64);
            let weighted: usize = stats.tensors_per_operation.iter().map(|(&k, &v)| k * v as usize).sum();
            prop_assert_eq!(weighted as u64, stats.tensors);
        }
    }
}
