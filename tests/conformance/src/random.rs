//! Random sequences of collectives for property tests: generated once (from
//! a proptest strategy, or from a seed every rank shares), run on every
//! rank, each result checked against the reference.

use crate::checks::{
    check_allgatherv_on, check_allreduce_on, check_allreduce_segments_on, check_alltoallv_on,
    check_barrier_on, check_broadcast_on, check_reduce_scatter_on, check_send_recv_on,
    check_sendrecv_on, check_transaction_on,
};
use crate::failure::Failure;
use crate::suite::{Report, SCALED};
use crate::values::{uneven_counts, uneven_segments};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{with_element_type, Collectives, Controller, Host, Memory, Scale};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// The operation of a [`RandomCase`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RandomOp {
    /// [`crate::check_allreduce`].
    Allreduce,
    /// [`crate::check_allreduce_segments`] with [`crate::uneven_segments`].
    AllreduceSegments,
    /// [`crate::check_reduce_scatter`] with [`crate::uneven_counts`].
    ReduceScatter,
    /// [`crate::check_allgatherv`] with [`crate::uneven_counts`].
    Allgatherv,
    /// [`crate::check_broadcast`].
    Broadcast,
    /// [`crate::check_alltoallv`].
    Alltoallv,
    /// [`crate::check_send_recv`] (needs buffered sends).
    SendRecvTags,
    /// [`crate::check_sendrecv`].
    SendRecvRing,
    /// [`crate::check_barrier`], one round.
    Barrier,
    /// [`crate::check_transaction`].
    Transaction,
}

impl RandomOp {
    /// Every operation.
    pub const ALL: [RandomOp; 10] = [
        RandomOp::Allreduce,
        RandomOp::AllreduceSegments,
        RandomOp::ReduceScatter,
        RandomOp::Allgatherv,
        RandomOp::Broadcast,
        RandomOp::Alltoallv,
        RandomOp::SendRecvTags,
        RandomOp::SendRecvRing,
        RandomOp::Barrier,
        RandomOp::Transaction,
    ];

    fn name(self) -> &'static str {
        match self {
            RandomOp::Allreduce => "allreduce",
            RandomOp::AllreduceSegments => "allreduce_segments",
            RandomOp::ReduceScatter => "reduce_scatter",
            RandomOp::Allgatherv => "allgatherv",
            RandomOp::Broadcast => "broadcast",
            RandomOp::Alltoallv => "alltoallv",
            RandomOp::SendRecvTags => "send_recv",
            RandomOp::SendRecvRing => "sendrecv",
            RandomOp::Barrier => "barrier",
            RandomOp::Transaction => "transaction",
        }
    }
}

/// One collective of a random sequence. Independent of the communicator's
/// size: `root` is taken modulo the size when the case runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RandomCase {
    /// Which operation.
    pub op: RandomOp,
    /// Element type.
    pub dtype: DataType,
    /// Element count (the base of the uneven counts where those are used).
    pub count: usize,
    /// Broadcast root, modulo the size.
    pub root: usize,
    /// Reduce op of the reductions.
    pub reduce: ReduceOp,
    /// Whether the reductions also prescale by 0.5 and postscale by 2.
    pub scaled: bool,
}

/// One random case with counts up to `max_count`.
pub fn random_case(max_count: usize) -> impl Strategy<Value = RandomCase> {
    (
        prop::sample::select(RandomOp::ALL.to_vec()),
        prop::sample::select(DataType::ALL.to_vec()),
        0..=max_count,
        0usize..64,
        prop::sample::select(ReduceOp::ALL.to_vec()),
        any::<bool>(),
    )
        .prop_map(|(op, dtype, count, root, reduce, scaled)| RandomCase {
            op,
            dtype,
            count,
            root,
            reduce,
            scaled,
        })
}

/// A sequence of 1 to `max_len` random cases with counts up to `max_count`:
/// generate it in the test, then run it on every rank with
/// [`run_random_cases`].
pub fn random_cases_strategy(
    max_len: usize,
    max_count: usize,
) -> impl Strategy<Value = Vec<RandomCase>> {
    prop::collection::vec(random_case(max_count), 1..=max_len.max(1))
}

/// The same sequence for the same `seed` on every rank and every machine:
/// for backends whose ranks cannot share a generated value (one process per
/// rank), which agree on a seed instead.
pub fn random_cases(seed: u64, len: usize, max_count: usize) -> Vec<RandomCase> {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &key);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let strategy = prop::collection::vec(random_case(max_count), len);
    match strategy.new_tree(&mut runner) {
        Ok(tree) => tree.current(),
        // A plain vector strategy never rejects; stay total regardless.
        Err(_) => Vec::new(),
    }
}

/// Runs `cases` in order on `comm` (collectively, same cases on every
/// rank), checking each against the reference.
pub fn run_random_cases<C: Collectives + Controller>(
    comm: &mut C,
    cases: &[RandomCase],
) -> Result<Report, Failure> {
    run_random_cases_on::<Host, C>(comm, cases)
}

/// [`run_random_cases`] on memory `M`.
pub fn run_random_cases_on<M: Memory, C: Collectives<M> + Controller>(
    comm: &mut C,
    cases: &[RandomCase],
) -> Result<Report, Failure> {
    let mut report = Report::default();
    for case in cases {
        run_case::<M, C>(comm, case)?;
        report.add(case.op.name(), 1);
    }
    Ok(report)
}

fn run_case<M: Memory, C: Collectives<M> + Controller>(
    comm: &mut C,
    case: &RandomCase,
) -> Result<(), Failure> {
    let n = comm.size();
    let scale = if case.scaled { SCALED } else { Scale::NONE };
    let count = case.count;
    with_element_type!(case.dtype, T => match case.op {
        RandomOp::Allreduce => check_allreduce_on::<M, T, C>(comm, count, case.reduce, scale),
        RandomOp::AllreduceSegments => {
            let lens = uneven_segments(count);
            check_allreduce_segments_on::<M, T, C>(comm, &lens, case.reduce, scale)
        }
        RandomOp::ReduceScatter => {
            let counts = uneven_counts(count, n);
            check_reduce_scatter_on::<M, T, C>(comm, &counts, case.reduce, scale)
        }
        RandomOp::Allgatherv => check_allgatherv_on::<M, T, C>(comm, &uneven_counts(count, n)),
        RandomOp::Broadcast => check_broadcast_on::<M, T, C>(comm, count, case.root % n),
        RandomOp::Alltoallv => check_alltoallv_on::<M, T, C>(comm, count),
        RandomOp::SendRecvTags => check_send_recv_on::<M, T, C>(comm, count),
        RandomOp::SendRecvRing => check_sendrecv_on::<M, T, C>(comm, count),
        RandomOp::Barrier => check_barrier_on::<M, C>(comm, 1),
        RandomOp::Transaction => check_transaction_on::<M, T, C>(comm, count),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_sequence() {
        let a = random_cases(42, 20, 100);
        assert_eq!(a.len(), 20);
        assert_eq!(a, random_cases(42, 20, 100));
        assert_ne!(a, random_cases(43, 20, 100));
        assert!(a.iter().all(|c| c.count <= 100 && c.root < 64));
    }
}
