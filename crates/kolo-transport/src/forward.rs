//! A `&mut` borrow of a backend is itself a backend: every method is
//! forwarded, the overridden collectives included, so code generic over
//! `C: Collectives` can be handed `&mut comm` and wrappers such as
//! `Generic(&mut *comm)` work without giving the communicator away.

use crate::element::Element;
use crate::error::Result;
use crate::traits::{BitOp, Collectives, Controller, MemoryKind, Scale, Topology};
use crate::transaction::Transaction;
use kolo_protocol::ReduceOp;

impl<C: Topology + ?Sized> Topology for &mut C {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn local_rank(&self) -> usize {
        (**self).local_rank()
    }
    fn local_size(&self) -> usize {
        (**self).local_size()
    }
}

impl<C: Controller + ?Sized> Controller for &mut C {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        (**self).gather_bytes(msg, root)
    }
    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        (**self).broadcast_bytes(msg, root)
    }
    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        (**self).allgather_bytes(msg)
    }
    fn control_barrier(&mut self) -> Result<()> {
        (**self).control_barrier()
    }
    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        (**self).bitwise_allreduce(words, op)
    }
}

/// Sized `C` only: the collectives are `where Self: Sized` methods, which
/// cannot be called through an unsized `C`.
impl<C: Collectives> Collectives for &mut C {
    fn memory(&self) -> MemoryKind {
        (**self).memory()
    }
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        (**self).send(buf, peer, tag)
    }
    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        (**self).recv(buf, peer, tag)
    }
    fn sendrecv<T: Element>(
        &mut self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
        tag: u32,
    ) -> Result<()> {
        (**self).sendrecv(send, dst, recv, src, tag)
    }
    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()> {
        (**self).allreduce(buf, op, scale)
    }
    fn reduces_segments_in_place(&self) -> bool {
        (**self).reduces_segments_in_place()
    }
    fn allreduce_segments<T: Element>(
        &mut self,
        segments: &mut [&mut [T]],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        (**self).allreduce_segments(segments, op, scale)
    }
    fn allgatherv<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        (**self).allgatherv(send, recv, counts)
    }
    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        (**self).broadcast(buf, root)
    }
    fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        (**self).reduce_scatter(send, recv, counts, op, scale)
    }
    fn alltoallv<T: Element>(
        &mut self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        (**self).alltoallv(send, send_counts, recv, recv_counts)
    }
    fn barrier(&mut self) -> Result<()> {
        (**self).barrier()
    }
    fn execute<T: Element>(&mut self, tx: Transaction<'_, T>) -> Result<()> {
        (**self).execute(tx)
    }
}
