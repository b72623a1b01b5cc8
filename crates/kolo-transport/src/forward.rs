//! A `&mut` borrow of a backend is itself a backend: every method is
//! forwarded, the overridden collectives included, so code generic over
//! `C: Collectives` can be handed `&mut comm` and wrappers such as
//! `Generic(&mut *comm)` work without giving the communicator away.

use crate::element::Element;
use crate::error::Result;
use crate::memory::Memory;
use crate::traits::{BitOp, Collectives, Controller, Lane, MemoryKind, Scale, Topology};
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
impl<M: Memory, C: Collectives<M>> Collectives<M> for &mut C {
    fn memory(&self) -> MemoryKind {
        (**self).memory()
    }
    fn send<T: Element>(&mut self, buf: M::Ref<'_, T>, peer: usize, tag: u32) -> Result<()> {
        (**self).send(buf, peer, tag)
    }
    fn recv<T: Element>(&mut self, buf: M::Mut<'_, T>, peer: usize, tag: u32) -> Result<()> {
        (**self).recv(buf, peer, tag)
    }
    fn sendrecv<T: Element>(
        &mut self,
        send: M::Ref<'_, T>,
        dst: usize,
        recv: M::Mut<'_, T>,
        src: usize,
        tag: u32,
    ) -> Result<()> {
        (**self).sendrecv(send, dst, recv, src, tag)
    }
    fn sendrecv_lanes<T: Element>(&mut self, lanes: &mut [Lane<'_, T, M>]) -> Result<()> {
        (**self).sendrecv_lanes(lanes)
    }
    fn allreduce<T: Element>(
        &mut self,
        buf: M::Mut<'_, T>,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        (**self).allreduce(buf, op, scale)
    }
    fn reduces_segments_in_place(&self) -> bool {
        (**self).reduces_segments_in_place()
    }
    fn allreduce_segments<T: Element>(
        &mut self,
        segments: &mut [M::Mut<'_, T>],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        (**self).allreduce_segments(segments, op, scale)
    }
    fn allgatherv<T: Element>(
        &mut self,
        send: M::Ref<'_, T>,
        recv: M::Mut<'_, T>,
        counts: &[usize],
    ) -> Result<()> {
        (**self).allgatherv(send, recv, counts)
    }
    fn broadcast<T: Element>(&mut self, buf: M::Mut<'_, T>, root: usize) -> Result<()> {
        (**self).broadcast(buf, root)
    }
    fn reduce_scatter<T: Element>(
        &mut self,
        send: M::Ref<'_, T>,
        recv: M::Mut<'_, T>,
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        (**self).reduce_scatter(send, recv, counts, op, scale)
    }
    fn alltoallv<T: Element>(
        &mut self,
        send: M::Ref<'_, T>,
        send_counts: &[usize],
        recv: M::Mut<'_, T>,
        recv_counts: &[usize],
    ) -> Result<()> {
        (**self).alltoallv(send, send_counts, recv, recv_counts)
    }
    fn barrier(&mut self) -> Result<()> {
        (**self).barrier()
    }
    fn execute<T: Element>(&mut self, tx: Transaction<'_, T, M>) -> Result<()> {
        (**self).execute(tx)
    }
    fn synchronize(&mut self) -> Result<()> {
        (**self).synchronize()
    }
    fn new_buffer<T: Element>(&mut self, len: usize) -> Result<M::Owned<T>> {
        (**self).new_buffer(len)
    }
    fn buffer_from<T: Element>(&mut self, data: &[T]) -> Result<M::Owned<T>> {
        (**self).buffer_from(data)
    }
    fn read_buffer<T: Element>(&mut self, buf: M::Ref<'_, T>) -> Result<Vec<T>> {
        (**self).read_buffer(buf)
    }
    fn pack_into<T: Element>(&mut self, srcs: &[M::Ref<'_, T>], dst: M::Mut<'_, T>) -> Result<()> {
        (**self).pack_into(srcs, dst)
    }
    fn unpack_from<T: Element>(
        &mut self,
        src: M::Ref<'_, T>,
        dsts: &mut [M::Mut<'_, T>],
    ) -> Result<()> {
        (**self).unpack_from(src, dsts)
    }
}
