//! Running fused responses on any [`Collectives`](kolo_transport::Collectives)
//! backend of any [`Memory`]: copy in, one collective, copy out — written
//! once for every backend and memory, with the backend's own copies and
//! buffers. A fused allreduce on a backend that reduces scattered segments
//! in place (kolo-threads) skips the copies: one collective straight over
//! the tensors.
//!
//! The fusion buffers are sized from the tensors they hold, so the helpers
//! hand their layouts to the backend's `pack_into` / `unpack_from` as they
//! are, without [`crate::pack_into`]'s check: on many small tensors a pass
//! over them less is what keeps the host path as fast as plain copies.
//!
//! Each helper reports its phases to an observer so that the engine can
//! record them as timeline activities.

mod allgather;
mod allreduce;
mod compressed;
mod reduce_scatter;

pub use allgather::fused_allgather;
pub use allreduce::fused_allreduce;
pub use compressed::compressed_allreduce;
pub use reduce_scatter::fused_reduce_scatter;

use crate::error::FusionError;

/// A phase of a fused operation, as reported to the observer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Copying the tensors into the fusion buffer.
    MemcpyInFusionBuffer,
    /// The backend's collective.
    Collective,
    /// Copying the results out of the fusion buffer.
    MemcpyOutFusionBuffer,
}

impl Phase {
    /// Horovod's timeline name for the phase (`MEMCPY_IN_FUSION_BUFFER`,
    /// `COLLECTIVE`, `MEMCPY_OUT_FUSION_BUFFER`); the engine may name the
    /// collective after its backend instead.
    pub const fn name(self) -> &'static str {
        match self {
            Phase::MemcpyInFusionBuffer => "MEMCPY_IN_FUSION_BUFFER",
            Phase::Collective => "COLLECTIVE",
            Phase::MemcpyOutFusionBuffer => "MEMCPY_OUT_FUSION_BUFFER",
        }
    }
}

/// Whether a phase starts or ends. Every `Start` is followed by the `End`
/// of the same phase, also when the phase fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Edge {
    Start,
    End,
}

/// Runs `f` between the `Start` and `End` of `phase`.
fn observed<R>(observer: &mut dyn FnMut(Phase, Edge), phase: Phase, f: impl FnOnce() -> R) -> R {
    observer(phase, Edge::Start);
    let result = f();
    observer(phase, Edge::End);
    result
}

/// Fails unless an argument list has the expected number of entries.
fn check_count(
    op: &'static str,
    what: impl Into<String>,
    expected: usize,
    actual: usize,
) -> Result<(), FusionError> {
    if expected == actual {
        Ok(())
    } else {
        Err(FusionError::ArgumentCount {
            op,
            what: what.into(),
            expected,
            actual,
        })
    }
}

/// Fails unless tensor `tensor`'s buffer has the expected length.
fn check_len(
    op: &'static str,
    tensor: usize,
    expected: usize,
    actual: usize,
) -> Result<(), FusionError> {
    if expected == actual {
        Ok(())
    } else {
        Err(FusionError::TensorLength {
            op,
            tensor,
            expected,
            actual,
        })
    }
}

/// `sum(values)`, or an overflow error naming `tensor`.
fn checked_sum(
    op: &'static str,
    tensor: usize,
    values: impl IntoIterator<Item = usize>,
) -> Result<usize, FusionError> {
    values
        .into_iter()
        .try_fold(0usize, |acc, v| acc.checked_add(v))
        .ok_or(FusionError::Overflow { op, tensor })
}

/// The total of the tensors' `lens`, or an overflow error naming the
/// tensor whose length overflows it.
fn total_len(
    op: &'static str,
    lens: impl IntoIterator<Item = usize>,
) -> Result<usize, FusionError> {
    let mut total = 0usize;
    for (tensor, len) in lens.into_iter().enumerate() {
        total = total
            .checked_add(len)
            .ok_or(FusionError::Overflow { op, tensor })?;
    }
    Ok(total)
}

#[cfg(test)]
mod loopback;
