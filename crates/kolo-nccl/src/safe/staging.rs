//! [`HostStaging`]: kolo's host data plane served by NCCL (see the type).

use crate::error::NcclError;
use crate::outbox::Outbox;
use crate::plan;
use crate::safe::comm::NcclComm;
use crate::widen::{self, Carrier};
use cudarc::driver::CudaSlice;
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{
    byte_view, Collectives, Controller, Element, MemoryKind, Result, Scale, Topology, Transaction,
    TransportError,
};

/// Default bound on the device memory of one staged allreduce / broadcast
/// piece.
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 20;

/// kolo's host-memory data plane ([`kolo_transport::Collectives`]) served
/// by NCCL — copy the host slice to the device, run the NCCL operation,
/// wait, copy back — so the one conformance suite runs on NCCL, in both
/// modes. The control plane is forwarded to the controller the
/// communicator was built with.
///
/// Reductions match kolo's element semantics exactly: scales are applied
/// on the host with [`Element::scale`] (prescale before, `postscale` / n
/// after), 16-bit integers reduce as i32 (wrapping arithmetic truncates
/// back exactly) and f16 / bf16 as f32 (rounded back once). Everything
/// travels as bytes, so every dtype works.
///
/// Point-to-point: NCCL has no tags and its sends wait for the receiver,
/// so `send` only stages the data on the device; every staged send is
/// issued in one NCCL group with this rank's next receive, `sendrecv` or
/// transaction, and at drop (so rings of any size, such as send right /
/// barrier / receive left, pair up). Messages between a pair are matched in the order sent whatever their tags:
/// receiving in another order than sending (kolo-conformance's
/// `unordered_p2p`) is not supported, and a receive of another length than
/// the matching send is undefined (NCCL cannot report it). Zero-length
/// messages are not sent at all. In copy-engine mode a transaction fails
/// while sends to its peers are still staged.
pub struct HostStaging<'a, C: Controller + ?Sized> {
    pub(crate) comm: &'a mut NcclComm,
    ctrl: &'a mut C,
    pub(crate) staged: Outbox<CudaSlice<u8>>,
    chunk_bytes: usize,
}

/// `buf` as bytes of its carrier type (see [`crate::widen`]).
pub(crate) fn carrier_bytes<T: Element>(buf: &[T]) -> (DataType, Vec<u8>) {
    match widen::carrier(T::DTYPE) {
        Carrier::Native => (T::DTYPE, byte_view::as_bytes(buf).to_vec()),
        Carrier::I32 => (
            DataType::I32,
            widen::to_i32(buf)
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect(),
        ),
        Carrier::F32 => (
            DataType::F32,
            widen::to_f32(buf)
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect(),
        ),
    }
}

/// Writes carrier `bytes` back into `out`.
pub(crate) fn from_carrier<T: Element>(bytes: &[u8], out: &mut [T]) -> Result<()> {
    let words = |n: usize| {
        bytes
            .chunks_exact(4)
            .take(n)
            .map(|c| [c[0], c[1], c[2], c[3]])
    };
    match widen::carrier(T::DTYPE) {
        Carrier::Native => byte_view::copy_from_bytes(out, bytes),
        Carrier::I32 => widen::from_i32(
            &words(out.len()).map(i32::from_ne_bytes).collect::<Vec<_>>(),
            out,
        ),
        Carrier::F32 => {
            widen::from_f32(
                &words(out.len()).map(f32::from_ne_bytes).collect::<Vec<_>>(),
                out,
            );
            Ok(())
        }
    }
}

impl<'a, C: Controller + ?Sized> HostStaging<'a, C> {
    /// Host collectives on `comm`, control plane on `ctrl` (the controller
    /// `comm` was built with: same ranks).
    pub fn new(comm: &'a mut NcclComm, ctrl: &'a mut C) -> Self {
        HostStaging {
            comm,
            ctrl,
            staged: Outbox::default(),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }

    /// Bounds the device memory of one staged allreduce / broadcast piece
    /// (larger buffers go in chunks; every rank must use the same bound).
    pub fn with_chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes.max(8);
        self
    }

    /// The communicator.
    pub fn comm(&mut self) -> &mut NcclComm {
        self.comm
    }

    /// Device copy of `bytes` (one spare byte when empty: no zero-size
    /// allocation).
    pub(crate) fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, NcclError> {
        self.comm.check_health()?;
        let stream = self.comm.stream();
        if bytes.is_empty() {
            return stream
                .alloc_zeros::<u8>(1)
                .map_err(NcclError::on_cuda("cuMemAllocAsync"));
        }
        stream
            .clone_htod(bytes)
            .map_err(NcclError::on_cuda("cuMemcpyHtoDAsync"))
    }

    pub(crate) fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>, NcclError> {
        self.comm.check_health()?;
        self.comm
            .stream()
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(NcclError::on_cuda("cuMemAllocAsync"))
    }

    /// Copies the first `out.len()` bytes of `dev` back; called after the
    /// operation writing them has completed, so it does not block on peers.
    pub(crate) fn download(&self, dev: &CudaSlice<u8>, out: &mut [u8]) -> Result<(), NcclError> {
        if out.is_empty() {
            return Ok(());
        }
        self.comm
            .stream()
            .memcpy_dtoh(&dev.slice(..out.len()), out)
            .map_err(NcclError::on_cuda("cuMemcpyDtoHAsync"))
    }

    fn allreduce_host<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<(), NcclError> {
        T::scale(buf, scale.prescale);
        let (dtype, mut bytes) = carrier_bytes(buf);
        let elem = dtype.size();
        for chunk in plan::chunks(buf.len(), self.chunk_bytes / elem) {
            let range = chunk.start * elem..chunk.end * elem;
            let mut dev = self.upload(&bytes[range.clone()])?;
            self.comm
                .all_reduce_dyn(
                    &mut dev,
                    dtype,
                    chunk.len(),
                    widen::device_op(op),
                    Scale::NONE,
                )?
                .wait()?;
            self.download(&dev, &mut bytes[range])?;
        }
        from_carrier(&bytes, buf).map_err(|e| NcclError::InvalidArgument(e.to_string()))?;
        T::scale(buf, scale.postscale_for(op, self.comm.size()));
        Ok(())
    }

    fn reduce_scatter_host<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<(), NcclError> {
        plan::reduce_scatter(
            self.comm.rank(),
            self.comm.size(),
            send.len(),
            recv.len(),
            counts,
        )?;
        let mut input = send.to_vec();
        T::scale(&mut input, scale.prescale);
        let (dtype, bytes) = carrier_bytes(&input);
        let recv_bytes = recv.len() * dtype.size();
        // Device buffers are at least one byte long; the views hold exactly
        // the data, so zero counts stay zero.
        let dev_send = self.upload(&bytes)?;
        let mut dev_recv = self.alloc(recv_bytes)?;
        self.comm
            .reduce_scatter_dyn(
                &dev_send.slice(..bytes.len()),
                &mut dev_recv.slice_mut(..recv_bytes),
                dtype,
                counts,
                widen::device_op(op),
                Scale::NONE,
            )?
            .wait()?;
        let mut out = vec![0u8; recv.len() * dtype.size()];
        self.download(&dev_recv, &mut out)?;
        from_carrier(&out, recv).map_err(|e| NcclError::InvalidArgument(e.to_string()))?;
        T::scale(recv, scale.postscale_for(op, self.comm.size()));
        Ok(())
    }

    /// Issues every staged send, then `sends`, with receives of `recvs`
    /// (peer, bytes) in one NCCL group; waits; returns the received bytes
    /// in order.
    fn exchange(
        &mut self,
        sends: Vec<(usize, CudaSlice<u8>)>,
        recvs: &[(usize, usize)],
    ) -> Result<Vec<Vec<u8>>, NcclError> {
        let mut all = self.staged.take_all();
        all.extend(sends);
        let mut bufs = recvs
            .iter()
            .map(|&(_, bytes)| self.alloc(bytes))
            .collect::<Result<Vec<_>, _>>()?;
        if all.is_empty() && bufs.is_empty() {
            return Ok(Vec::new());
        }
        {
            let send_refs: Vec<(&CudaSlice<u8>, usize)> =
                all.iter().map(|(p, b)| (b, *p)).collect();
            let mut recv_refs: Vec<(&mut CudaSlice<u8>, usize)> = bufs
                .iter_mut()
                .zip(recvs)
                .map(|(b, &(p, _))| (b, p))
                .collect();
            self.comm
                .send_recv_many(&send_refs, &mut recv_refs)?
                .wait()?;
        }
        let mut out = Vec::with_capacity(bufs.len());
        for (buf, &(_, bytes)) in bufs.iter().zip(recvs) {
            let mut host = vec![0u8; bytes];
            self.download(buf, &mut host)?;
            out.push(host);
        }
        Ok(out)
    }

    pub(crate) fn check_peer(&self, peer: usize) -> Result<(), NcclError> {
        if peer >= self.comm.size() {
            return Err(NcclError::InvalidArgument(format!(
                "peer {peer} of {} ranks",
                self.comm.size()
            )));
        }
        Ok(())
    }
}

impl<C: Controller + ?Sized> Drop for HostStaging<'_, C> {
    /// Issues sends still staged and waits for them at most the
    /// communicator's teardown bound (a peer that never receives leaves
    /// them pending; closing the communicator then aborts it).
    fn drop(&mut self) {
        let staged = self.staged.take_all();
        if staged.is_empty() {
            return;
        }
        let bound = self.comm.options().teardown_timeout;
        let sends: Vec<(&CudaSlice<u8>, usize)> = staged.iter().map(|(p, b)| (b, *p)).collect();
        if let Ok(work) = self.comm.send_recv_many(&sends, &mut []) {
            let _ = work.wait_timeout(bound);
        }
    }
}

crate::comm_and_control!(HostStaging);

impl<C: Controller + ?Sized> Collectives for HostStaging<'_, C> {
    fn memory(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn send<T: Element>(&mut self, buf: &[T], peer: usize, _tag: u32) -> Result<()> {
        self.check_peer(peer)?;
        let bytes = byte_view::as_bytes(buf);
        if !bytes.is_empty() {
            let staged = self.upload(bytes)?;
            self.staged.push(peer, staged);
        }
        Ok(())
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, _tag: u32) -> Result<()> {
        self.check_peer(peer)?;
        let bytes = std::mem::size_of_val(buf);
        if bytes == 0 {
            return Ok(());
        }
        let got = self.exchange(Vec::new(), &[(peer, bytes)])?;
        let data = got
            .first()
            .ok_or_else(|| TransportError::Backend("NCCL receive returned no buffer".into()))?;
        byte_view::copy_from_bytes(buf, data)
    }

    fn sendrecv<T: Element>(
        &mut self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
        _tag: u32,
    ) -> Result<()> {
        self.check_peer(dst)?;
        self.check_peer(src)?;
        let out = byte_view::as_bytes(send);
        let sends = if out.is_empty() {
            Vec::new()
        } else {
            vec![(dst, self.upload(out)?)]
        };
        let bytes = std::mem::size_of_val(recv);
        let recvs = if bytes == 0 {
            Vec::new()
        } else {
            vec![(src, bytes)]
        };
        let got = self.exchange(sends, &recvs)?;
        if let Some(data) = got.first() {
            byte_view::copy_from_bytes(recv, data)?;
        }
        Ok(())
    }

    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()> {
        Ok(self.allreduce_host(buf, op, scale)?)
    }

    fn allgatherv<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        plan::allgatherv(
            self.comm.rank(),
            self.comm.size(),
            send.len(),
            recv.len(),
            counts,
        )?;
        let elem = std::mem::size_of::<T>();
        let byte_counts: Vec<usize> = counts.iter().map(|c| c * elem).collect();
        let dev_send = self.upload(byte_view::as_bytes(send))?;
        let mut dev_recv = self.alloc(std::mem::size_of_val(recv))?;
        self.comm
            .all_gatherv(
                &dev_send.slice(..std::mem::size_of_val(send)),
                &mut dev_recv.slice_mut(..std::mem::size_of_val(recv)),
                &byte_counts,
            )?
            .wait()?;
        let mut bytes = vec![0u8; std::mem::size_of_val(recv)];
        self.download(&dev_recv, &mut bytes)?;
        byte_view::copy_from_bytes(recv, &bytes)
    }

    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        self.check_peer(root)?;
        let mut bytes = byte_view::as_bytes(buf).to_vec();
        for range in plan::chunks(bytes.len(), self.chunk_bytes) {
            let mut dev = self.upload(&bytes[range.clone()])?;
            self.comm
                .broadcast(&mut dev.slice_mut(..range.len()), root)?
                .wait()?;
            self.download(&dev, &mut bytes[range])?;
        }
        byte_view::copy_from_bytes(buf, &bytes)
    }

    fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        Ok(self.reduce_scatter_host(send, recv, counts, op, scale)?)
    }

    fn alltoallv<T: Element>(
        &mut self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        plan::alltoallv(
            self.comm.rank(),
            self.comm.size(),
            send.len(),
            send_counts,
            recv.len(),
            recv_counts,
        )?;
        let elem = std::mem::size_of::<T>();
        let to_bytes = |counts: &[usize]| counts.iter().map(|c| c * elem).collect::<Vec<_>>();
        let (send_bytes, recv_bytes) = (std::mem::size_of_val(send), std::mem::size_of_val(recv));
        let dev_send = self.upload(byte_view::as_bytes(send))?;
        let mut dev_recv = self.alloc(recv_bytes)?;
        self.comm
            .all_to_allv(
                &dev_send.slice(..send_bytes),
                &to_bytes(send_counts),
                &mut dev_recv.slice_mut(..recv_bytes),
                &to_bytes(recv_counts),
            )?
            .wait()?;
        let mut bytes = vec![0u8; recv_bytes];
        self.download(&dev_recv, &mut bytes)?;
        byte_view::copy_from_bytes(recv, &bytes)
    }

    /// A control-plane barrier: staged sends stay staged (a barrier neither
    /// loses nor consumes messages).
    fn barrier(&mut self) -> Result<()> {
        self.ctrl.control_barrier()
    }

    fn execute<T: Element>(&mut self, tx: Transaction<'_, T>) -> Result<()> {
        Ok(self.execute_host(tx)?)
    }
}
