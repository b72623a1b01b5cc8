//! The [`Generic`] adapter: a backend seen through its point-to-point
//! operations only.

use crate::element::Element;
use crate::error::Result;
use crate::traits::{BitOp, Collectives, Controller, MemoryKind, Topology};

/// Wraps a backend so that only its `send`, `recv` and `sendrecv` are used:
/// every collective then runs the generic algorithms of this module (the
/// control plane, if any, is forwarded unchanged). That includes
/// [`Collectives::allreduce_segments`] and
/// [`Collectives::reduces_segments_in_place`], which keep their defaults
/// (one generic allreduce per segment; no in-place segments) instead of
/// the backend's. Used to test the generic
/// algorithms over any backend (the threads backend in CI):
/// `Generic(&mut *comm)` borrows a communicator for a while.
#[derive(Debug)]
pub struct Generic<C>(pub C);

impl<C: Topology> Topology for Generic<C> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn local_rank(&self) -> usize {
        self.0.local_rank()
    }
    fn local_size(&self) -> usize {
        self.0.local_size()
    }
}

/// Forwards only the point-to-point methods: `allreduce_segments` and
/// `reduces_segments_in_place` stay the trait's defaults on purpose.
impl<C: Collectives> Collectives for Generic<C> {
    fn memory(&self) -> MemoryKind {
        self.0.memory()
    }
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.0.send(buf, peer, tag)
    }
    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.0.recv(buf, peer, tag)
    }
    fn sendrecv<T: Element>(
        &mut self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
        tag: u32,
    ) -> Result<()> {
        self.0.sendrecv(send, dst, recv, src, tag)
    }
}

impl<C: Controller> Controller for Generic<C> {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        self.0.gather_bytes(msg, root)
    }
    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        self.0.broadcast_bytes(msg, root)
    }
    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.0.allgather_bytes(msg)
    }
    fn control_barrier(&mut self) -> Result<()> {
        self.0.control_barrier()
    }
    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        self.0.bitwise_allreduce(words, op)
    }
}
