//! [`CudaBackend`]: a complete kolo backend on device memory, the NCCL
//! data plane with the control plane it was built over.

use crate::safe::comm::NcclComm;
use crate::safe::memory::{Cuda, CudaBuffer};
use crate::safe::views::{CudaMut, CudaRef};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Controller, Element, Result, Scale, Transaction};

/// [`NcclComm`]'s device data plane (`Collectives<Cuda>`, see its impl)
/// and the [`Controller`] it was built with (which NCCL lacks), as one
/// value: what code written for a whole backend on any memory takes, e.g.
/// kolo-conformance's `run_suite_on::<Cuda, _>`. [`crate::HostStaging`]
/// is the same pairing for host memory.
pub struct CudaBackend<'a, C: Controller + ?Sized> {
    comm: &'a mut NcclComm,
    ctrl: &'a mut C,
}

impl<'a, C: Controller + ?Sized> CudaBackend<'a, C> {
    /// Device collectives on `comm`, control plane on `ctrl` (the
    /// controller `comm` was built with: the same ranks).
    pub fn new(comm: &'a mut NcclComm, ctrl: &'a mut C) -> Self {
        CudaBackend { comm, ctrl }
    }

    /// The communicator.
    pub fn comm(&mut self) -> &mut NcclComm {
        self.comm
    }
}

crate::comm_and_control!(CudaBackend);

/// Every method is `NcclComm`'s (named through the trait: several share a
/// name with its inherent device API).
impl<C: Controller + ?Sized> Collectives<Cuda> for CudaBackend<'_, C> {
    fn send<T: Element>(&mut self, buf: CudaRef<'_, T>, peer: usize, tag: u32) -> Result<()> {
        Collectives::<Cuda>::send(&mut *self.comm, buf, peer, tag)
    }
    fn recv<T: Element>(&mut self, buf: CudaMut<'_, T>, peer: usize, tag: u32) -> Result<()> {
        Collectives::<Cuda>::recv(&mut *self.comm, buf, peer, tag)
    }
    fn sendrecv<T: Element>(
        &mut self,
        send: CudaRef<'_, T>,
        dst: usize,
        recv: CudaMut<'_, T>,
        src: usize,
        tag: u32,
    ) -> Result<()> {
        Collectives::<Cuda>::sendrecv(&mut *self.comm, send, dst, recv, src, tag)
    }
    fn allreduce<T: Element>(
        &mut self,
        buf: CudaMut<'_, T>,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        Collectives::<Cuda>::allreduce(&mut *self.comm, buf, op, scale)
    }
    fn reduces_segments_in_place(&self) -> bool {
        Collectives::<Cuda>::reduces_segments_in_place(&*self.comm)
    }
    fn allreduce_segments<T: Element>(
        &mut self,
        segments: &mut [CudaMut<'_, T>],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        Collectives::<Cuda>::allreduce_segments(&mut *self.comm, segments, op, scale)
    }
    fn allgatherv<T: Element>(
        &mut self,
        send: CudaRef<'_, T>,
        recv: CudaMut<'_, T>,
        counts: &[usize],
    ) -> Result<()> {
        Collectives::<Cuda>::allgatherv(&mut *self.comm, send, recv, counts)
    }
    fn broadcast<T: Element>(&mut self, buf: CudaMut<'_, T>, root: usize) -> Result<()> {
        Collectives::<Cuda>::broadcast(&mut *self.comm, buf, root)
    }
    fn reduce_scatter<T: Element>(
        &mut self,
        send: CudaRef<'_, T>,
        recv: CudaMut<'_, T>,
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        Collectives::<Cuda>::reduce_scatter(&mut *self.comm, send, recv, counts, op, scale)
    }
    fn alltoallv<T: Element>(
        &mut self,
        send: CudaRef<'_, T>,
        send_counts: &[usize],
        recv: CudaMut<'_, T>,
        recv_counts: &[usize],
    ) -> Result<()> {
        Collectives::<Cuda>::alltoallv(&mut *self.comm, send, send_counts, recv, recv_counts)
    }
    fn barrier(&mut self) -> Result<()> {
        Collectives::<Cuda>::barrier(&mut *self.comm)
    }
    fn execute<T: Element>(&mut self, tx: Transaction<'_, T, Cuda>) -> Result<()> {
        Collectives::<Cuda>::execute(&mut *self.comm, tx)
    }
    fn synchronize(&mut self) -> Result<()> {
        Collectives::<Cuda>::synchronize(&mut *self.comm)
    }
    fn new_buffer<T: Element>(&mut self, len: usize) -> Result<CudaBuffer<T>> {
        Collectives::<Cuda>::new_buffer(&mut *self.comm, len)
    }
    fn buffer_from<T: Element>(&mut self, data: &[T]) -> Result<CudaBuffer<T>> {
        Collectives::<Cuda>::buffer_from(&mut *self.comm, data)
    }
    fn read_buffer<T: Element>(&mut self, buf: CudaRef<'_, T>) -> Result<Vec<T>> {
        Collectives::<Cuda>::read_buffer(&mut *self.comm, buf)
    }
    fn pack_into<T: Element>(
        &mut self,
        srcs: &[CudaRef<'_, T>],
        dst: CudaMut<'_, T>,
    ) -> Result<()> {
        Collectives::<Cuda>::pack_into(&mut *self.comm, srcs, dst)
    }
    fn unpack_from<T: Element>(
        &mut self,
        src: CudaRef<'_, T>,
        dsts: &mut [CudaMut<'_, T>],
    ) -> Result<()> {
        Collectives::<Cuda>::unpack_from(&mut *self.comm, src, dsts)
    }
}
