//! kolo's data plane on device memory: `Collectives<Cuda>` for
//! [`NcclComm`], over [`CudaRef`] / [`CudaMut`] views, through the same
//! safe operations as the inherent API (`all_reduce`, `all_gatherv`, ...).
//! The views' event tracking is [`Accesses`]'s.

use crate::error::NcclError;
use crate::reduce_plan::plan_reduce;
use crate::safe::access::Accesses;
use crate::safe::comm::NcclComm;
use crate::safe::memory::{Cuda, CudaBuffer};
use crate::safe::views::{CudaMut, CudaRef};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Element, Result, Scale, Topology, Transaction};

/// The device data plane, one NCCL operation per call.
///
/// **Stream-ordered**, unlike host memory: each call validates its
/// arguments, enqueues its work on the communicator's stream (after the
/// views' last uses, as cudarc tracks them) and returns; results are
/// visible once [`Collectives::synchronize`] has returned (which also
/// reports an asynchronous failure), and to cudarc's own operations on
/// the buffers through their events. `read_buffer` and `barrier` wait
/// themselves.
///
/// Point-to-point messages follow NCCL: there are no tags (messages
/// between two ranks are matched in the order sent, whatever their tags),
/// and since NCCL's sends wait for their receivers, `send` copies the
/// data into a staging buffer on the device; every staged send is issued
/// in one group with this rank's next `recv`, `sendrecv` or transaction
/// (or when the communicator closes), as [`crate::HostStaging`] does.
/// Receiving in another order than sending is not supported, nor is a
/// receive of another length than its send; zero-length messages are not
/// sent at all. In copy-engine mode a transaction fails while sends are
/// staged.
///
/// Reductions are [`crate::reduce_plan`]'s: every dtype but u16 / i16,
/// which fail as [`kolo_transport::TransportError::Unsupported`] before
/// anything is enqueued (also for zero segments).
impl Collectives<Cuda> for NcclComm {
    fn send<T: Element>(&mut self, buf: CudaRef<'_, T>, peer: usize, _tag: u32) -> Result<()> {
        Ok(self.stage_send(buf, peer)?)
    }

    fn recv<T: Element>(&mut self, buf: CudaMut<'_, T>, peer: usize, _tag: u32) -> Result<()> {
        if buf.is_empty() {
            self.check_peer(peer, "recv")?;
            return Ok(());
        }
        Ok(self.exchange(None, Some((buf, peer)))?)
    }

    fn sendrecv<T: Element>(
        &mut self,
        send: CudaRef<'_, T>,
        dst: usize,
        recv: CudaMut<'_, T>,
        src: usize,
        _tag: u32,
    ) -> Result<()> {
        Ok(self.exchange(Some((send, dst)), Some((recv, src)))?)
    }

    fn allreduce<T: Element>(
        &mut self,
        buf: CudaMut<'_, T>,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        let mut access = Accesses::new(self)?;
        let mut raw = access.write(&buf, "allreduce buffer")?;
        self.all_reduce(&mut raw, op, scale)?;
        Ok(())
    }

    fn allreduce_segments<T: Element>(
        &mut self,
        segments: &mut [CudaMut<'_, T>],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        // The answer for every segment, also when there is none.
        plan_reduce(T::DTYPE, op, scale, self.size())?;
        for segment in segments.iter_mut() {
            Collectives::<Cuda>::allreduce(self, segment.reborrow(), op, scale)?;
        }
        Ok(())
    }

    fn allgatherv<T: Element>(
        &mut self,
        send: CudaRef<'_, T>,
        recv: CudaMut<'_, T>,
        counts: &[usize],
    ) -> Result<()> {
        let mut access = Accesses::new(self)?;
        let send = access.read(send, "allgather send buffer")?;
        let mut raw = access.write(&recv, "allgather recv buffer")?;
        self.all_gatherv(&send, &mut raw, counts)?;
        Ok(())
    }

    fn broadcast<T: Element>(&mut self, buf: CudaMut<'_, T>, root: usize) -> Result<()> {
        let mut access = Accesses::new(self)?;
        let mut raw = access.write(&buf, "broadcast buffer")?;
        NcclComm::broadcast(self, &mut raw, root)?;
        Ok(())
    }

    fn reduce_scatter<T: Element>(
        &mut self,
        send: CudaRef<'_, T>,
        recv: CudaMut<'_, T>,
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        let mut access = Accesses::new(self)?;
        let send = access.read(send, "reduce_scatter send buffer")?;
        let mut raw = access.write(&recv, "reduce_scatter recv buffer")?;
        NcclComm::reduce_scatter(self, &send, &mut raw, counts, op, scale)?;
        Ok(())
    }

    fn alltoallv<T: Element>(
        &mut self,
        send: CudaRef<'_, T>,
        send_counts: &[usize],
        recv: CudaMut<'_, T>,
        recv_counts: &[usize],
    ) -> Result<()> {
        let mut access = Accesses::new(self)?;
        let send = access.read(send, "alltoallv send buffer")?;
        let mut raw = access.write(&recv, "alltoallv recv buffer")?;
        self.all_to_allv(&send, send_counts, &mut raw, recv_counts)?;
        Ok(())
    }

    /// An allreduce of one byte, waited for: it completes once every rank
    /// has entered. Staged sends stay staged (a barrier neither loses nor
    /// consumes messages).
    fn barrier(&mut self) -> Result<()> {
        let mut token = self
            .stream()
            .alloc_zeros::<u8>(1)
            .map_err(NcclError::on_cuda("cuMemAllocAsync"))?;
        self.all_reduce(&mut token, ReduceOp::Max, Scale::NONE)?
            .wait()?;
        Ok(())
    }

    fn execute<T: Element>(&mut self, tx: Transaction<'_, T, Cuda>) -> Result<()> {
        Ok(self.execute_views(tx)?)
    }

    /// Waits (bounded by the operation timeout) for everything enqueued.
    fn synchronize(&mut self) -> Result<()> {
        self.flush()?.wait()?;
        Ok(())
    }

    fn new_buffer<T: Element>(&mut self, len: usize) -> Result<CudaBuffer<T>> {
        Ok(self.alloc_buffer(len)?)
    }

    fn buffer_from<T: Element>(&mut self, data: &[T]) -> Result<CudaBuffer<T>> {
        Ok(self.upload(data)?)
    }

    fn read_buffer<T: Element>(&mut self, buf: CudaRef<'_, T>) -> Result<Vec<T>> {
        self.download(buf)
    }

    fn pack_into<T: Element>(
        &mut self,
        srcs: &[CudaRef<'_, T>],
        dst: CudaMut<'_, T>,
    ) -> Result<()> {
        Ok(self.pack_views(srcs, dst)?)
    }

    fn unpack_from<T: Element>(
        &mut self,
        src: CudaRef<'_, T>,
        dsts: &mut [CudaMut<'_, T>],
    ) -> Result<()> {
        Ok(self.unpack_views(src, dsts)?)
    }
}
