//! Generic collective algorithms written once against point-to-point
//! `send` / `recv` / `sendrecv` of [`Collectives`] (Gloo's way): the defaults
//! of every collective in the trait. CONTRACT STUB: the transport work
//! replaces these bodies (one module per algorithm) and adds the
//! [`Generic`] adapter's tests.

use crate::element::Element;
use crate::error::Result;
use crate::traits::{Collectives, Scale, Topology};
use kolo_protocol::ReduceOp;

pub fn ring_allreduce<C: Collectives + ?Sized, T: Element>(
    _comm: &mut C,
    _buf: &mut [T],
    _op: ReduceOp,
    _scale: Scale,
) -> Result<()> {
    unimplemented!("transport work")
}

pub fn ring_allgatherv<C: Collectives + ?Sized, T: Element>(
    _comm: &mut C,
    _send: &[T],
    _recv: &mut [T],
    _counts: &[usize],
) -> Result<()> {
    unimplemented!("transport work")
}

pub fn ring_reduce_scatter<C: Collectives + ?Sized, T: Element>(
    _comm: &mut C,
    _send: &[T],
    _recv: &mut [T],
    _counts: &[usize],
    _op: ReduceOp,
    _scale: Scale,
) -> Result<()> {
    unimplemented!("transport work")
}

pub fn tree_broadcast<C: Collectives + ?Sized, T: Element>(_comm: &mut C, _buf: &mut [T], _root: usize) -> Result<()> {
    unimplemented!("transport work")
}

pub fn pairwise_alltoallv<C: Collectives + ?Sized, T: Element>(
    _comm: &mut C,
    _send: &[T],
    _send_counts: &[usize],
    _recv: &mut [T],
    _recv_counts: &[usize],
) -> Result<()> {
    unimplemented!("transport work")
}

pub fn dissemination_barrier<C: Collectives + ?Sized>(_comm: &mut C) -> Result<()> {
    unimplemented!("transport work")
}

/// Wraps a backend so that only its `send`, `recv` and `sendrecv` are used:
/// every collective then runs the generic algorithms of this module. Used to
/// test the generic algorithms over any backend (the threads backend in CI).
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

impl<C: Collectives> Collectives for Generic<C> {
    fn memory(&self) -> crate::traits::MemoryKind {
        self.0.memory()
    }
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.0.send(buf, peer, tag)
    }
    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.0.recv(buf, peer, tag)
    }
    fn sendrecv<T: Element>(&mut self, send: &[T], dst: usize, recv: &mut [T], src: usize, tag: u32) -> Result<()> {
        self.0.sendrecv(send, dst, recv, src, tag)
    }
}
