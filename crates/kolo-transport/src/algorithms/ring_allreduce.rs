//! Ring allreduce (bandwidth-optimal): a ring reduce-scatter over `n` nearly
//! equal chunks, the owner of each chunk applies the postscale, then a ring
//! allgather. Lengths not divisible by `n` give chunks one element apart;
//! lengths below `n` give empty chunks.

use super::blocks::Blocks;
use super::recursive_doubling::recursive_doubling_allreduce;
use super::ring_allgatherv::allgather_in_place;
use super::ring_reduce_scatter::reduce_scatter_in_place;
use super::ALLREDUCE_TAG;
use crate::element::Element;
use crate::error::Result;
use crate::traits::{Collectives, Scale};
use kolo_protocol::ReduceOp;

/// In place: `buf = postscale' * op_r(prescale * buf_r)` where `postscale'`
/// is [`Scale::postscale_for`]. Every rank passes the same length; a rank
/// whose length differs sees its peers' chunks as messages of the wrong
/// length (an `InvalidArgument` from `recv`).
pub fn ring_allreduce<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    buf: &mut [T],
    op: ReduceOp,
    scale: Scale,
) -> Result<()> {
    let (n, rank) = (comm.size(), comm.rank());
    let blocks = Blocks::even(buf.len(), n);
    T::scale(buf, scale.prescale);
    reduce_scatter_in_place(comm, buf, &blocks, op, ALLREDUCE_TAG)?;
    T::scale(&mut buf[blocks.range(rank)], scale.postscale_for(op, n));
    allgather_in_place(comm, buf, &blocks, ALLREDUCE_TAG)
}

/// Buffers up to this size take [`recursive_doubling_allreduce`]: its
/// `log2 n` whole-buffer exchanges beat the ring's `2 (n - 1)` half- or
/// smaller-block steps while the time is in the per-message latency, not
/// the bytes.
pub const SHORT_ALLREDUCE_BYTES: usize = 32 << 10;

/// The generic allreduce: [`recursive_doubling_allreduce`] up to
/// [`SHORT_ALLREDUCE_BYTES`], [`ring_allreduce`] above. Every rank passes
/// the same length, so every rank picks the same algorithm.
pub fn allreduce<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    buf: &mut [T],
    op: ReduceOp,
    scale: Scale,
) -> Result<()> {
    if std::mem::size_of_val(buf) <= SHORT_ALLREDUCE_BYTES {
        recursive_doubling_allreduce(comm, buf, op, scale)
    } else {
        ring_allreduce(comm, buf, op, scale)
    }
}
