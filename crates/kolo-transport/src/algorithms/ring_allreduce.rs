//! Ring allreduce (bandwidth-optimal): a ring reduce-scatter over `n` nearly
//! equal chunks, the owner of each chunk applies the postscale, then a ring
//! allgather. Lengths not divisible by `n` give chunks one element apart;
//! lengths below `n` give empty chunks.

use super::blocks::Blocks;
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
