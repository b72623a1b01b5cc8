//! The device data plane of [`NcclComm`]: collectives and point-to-point
//! operations on CUDA memory (cudarc's `CudaSlice`, `CudaView`,
//! `CudaViewMut`). Each call validates its arguments, enqueues NCCL work on
//! the communicator's stream (after GPU-side waits for the buffers' last
//! writes, through cudarc's per-buffer events) and returns a [`Work`].
//!
//! Counts are in elements. Data movement (all-gather, broadcast, send /
//! recv, alltoallv) moves bytes, so every [`Element`] works; the
//! reductions live in `reduce_ops.rs` and follow [`crate::reduce_plan`].

use crate::error::NcclError;
use crate::plan;
use crate::safe::comm::NcclComm;
use crate::safe::raw_comm::{grouped, RawComm};
use crate::safe::work::Work;
use cudarc::driver::{
    sys::CUdeviceptr, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, ValidAsZeroBits,
};
use kolo_transport::{Element, Topology};

/// An element kolo can move through NCCL on the device: a kolo
/// [`Element`] cudarc can hold (and zero) in device memory — all of them.
pub trait DeviceElement: Element + DeviceRepr + ValidAsZeroBits {}
impl<T: Element + DeviceRepr + ValidAsZeroBits> DeviceElement for T {}

/// `p` advanced by `elements` of `T`.
pub(crate) fn byte_offset<T>(p: CUdeviceptr, elements: usize) -> CUdeviceptr {
    p + (elements * std::mem::size_of::<T>()) as u64
}

impl NcclComm {
    /// Fails unless `buf` lives on this communicator's device.
    pub(crate) fn check_device<T, B: DeviceSlice<T> + ?Sized>(
        &self,
        buf: &B,
        what: &str,
    ) -> Result<(), NcclError> {
        let ordinal = buf.stream().context().ordinal();
        if ordinal != self.device.ordinal() {
            return Err(NcclError::InvalidArgument(format!(
                "{what} lives on device {ordinal}, but rank {} communicates on device {}",
                self.rank(),
                self.device.ordinal()
            )));
        }
        Ok(())
    }

    /// Runs one NCCL call over a single buffer of `bytes` bytes (nothing
    /// when it is empty) and tracks it as `what`: `call` gets the
    /// communication stream and the raw communicator.
    pub(crate) fn run_single(
        &mut self,
        what: String,
        bytes: usize,
        call: impl FnOnce(&CudaStream, &RawComm) -> Result<(), NcclError>,
    ) -> Result<Work, NcclError> {
        self.run(what, |comm| {
            if bytes == 0 {
                return Ok(());
            }
            let stream = comm.device.stream().clone();
            call(&stream, &*comm.raw()?)
        })
    }

    pub(crate) fn check_peer(&self, peer: usize, what: &str) -> Result<(), NcclError> {
        if peer >= self.size() {
            return Err(NcclError::InvalidArgument(format!(
                "{what}: rank {peer} of a {}-rank communicator",
                self.size()
            )));
        }
        Ok(())
    }

    /// The root's `buf` is copied into every rank's `buf`.
    pub fn broadcast<T: Element>(
        &mut self,
        buf: &mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<Work, NcclError> {
        self.check_device(buf, "broadcast buffer")?;
        self.check_peer(root, "broadcast root")?;
        let bytes = buf.num_bytes();
        self.run_single(
            format!("broadcast of {} {} from rank {root}", buf.len(), T::DTYPE),
            bytes,
            |stream, raw| {
                let (ptr, _written) = buf.device_ptr_mut(stream);
                // SAFETY: `ptr` holds `bytes` bytes of this device, alive until
                // the stream reaches the call (cudarc's events); root checked.
                unsafe { raw.broadcast(ptr, ptr, bytes, root, stream) }
            },
        )
    }

    /// Even all-gather: `recv` (`size * send.len()` elements) receives every
    /// rank's `send` in rank order. Runs on the copy engines when enabled.
    pub fn all_gather<T: Element>(
        &mut self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<Work, NcclError> {
        let counts = vec![send.len(); self.size()];
        self.all_gatherv(send, recv, &counts)
    }

    /// All-gather with per-rank counts: `recv` is every rank's `send`
    /// concatenated in rank order (`counts[r]` elements from rank r). Even
    /// counts use `ncclAllGather` (or the copy engines); uneven ones one
    /// grouped broadcast per rank.
    pub fn all_gatherv<T: Element>(
        &mut self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        counts: &[usize],
    ) -> Result<Work, NcclError> {
        self.check_device(send, "allgather send buffer")?;
        self.check_device(recv, "allgather recv buffer")?;
        let offsets = plan::allgatherv(self.rank(), self.size(), send.len(), recv.len(), counts)?;
        let size = std::mem::size_of::<T>();
        let even = plan::even(counts);
        let use_copy_engines = even.is_some() && self.copy.is_some();
        self.run(
            format!("allgather of {} {}", recv.len(), T::DTYPE),
            |comm| {
                if counts.iter().all(|&c| c == 0) {
                    return Ok(());
                }
                let stream = comm.device.stream().clone();
                let (s, _read) = send.device_ptr(&stream);
                let (r, _written) = recv.device_ptr_mut(&stream);
                if let (true, Some(copy), Some(count)) = (use_copy_engines, &comm.copy, even) {
                    return copy.round(
                        comm.rank(),
                        &stream,
                        &[(s, r, (count * size) as u64)],
                        Vec::new(),
                        Vec::new(),
                    );
                }
                let raw = comm.raw()?;
                if let Some(count) = even {
                    // SAFETY: `s` holds `count`, `r` `size * count` elements of
                    // this device (checked), alive until the stream reaches the
                    // call (cudarc's events).
                    return unsafe { raw.all_gather(s, r, count * size, &stream) };
                }
                grouped(|| {
                    for (root, (&count, &offset)) in counts
                        .iter()
                        .zip(&offsets)
                        .enumerate()
                        .filter(|(_, (&c, _))| c > 0)
                    {
                        let dst = byte_offset::<T>(r, offset);
                        // SAFETY: block `root` of `recv` holds `count` elements
                        // (offsets checked against recv's length); `s` is read
                        // on the root only, where it holds `count` elements.
                        unsafe { raw.broadcast(s, dst, count * size, root, &stream) }?;
                    }
                    Ok(())
                })
            },
        )
    }

    /// `send` holds `send_counts[p]` elements for each peer p in peer
    /// order; `recv` receives `recv_counts[p]` from each peer p. Grouped
    /// `ncclSend` / `ncclRecv`; this rank's own block is a local copy.
    pub fn all_to_allv<T: Element>(
        &mut self,
        send: &impl DevicePtr<T>,
        send_counts: &[usize],
        recv: &mut impl DevicePtrMut<T>,
        recv_counts: &[usize],
    ) -> Result<Work, NcclError> {
        self.check_device(send, "alltoallv send buffer")?;
        self.check_device(recv, "alltoallv recv buffer")?;
        let exchanges = plan::alltoallv(
            self.rank(),
            self.size(),
            send.len(),
            send_counts,
            recv.len(),
            recv_counts,
        )?;
        let size = std::mem::size_of::<T>();
        let me = self.rank();
        self.run(
            format!("alltoallv of {} {}", send.len(), T::DTYPE),
            |comm| {
                let stream = comm.device.stream().clone();
                let raw = comm.raw()?;
                let (s, _read) = send.device_ptr(&stream);
                let (r, _written) = recv.device_ptr_mut(&stream);
                grouped(|| {
                    for x in &exchanges {
                        let (src, dst) = (
                            byte_offset::<T>(s, x.send.start),
                            byte_offset::<T>(r, x.recv.start),
                        );
                        if x.peer == me {
                            if x.send.is_empty() {
                                continue;
                            }
                            // SAFETY: both blocks hold `x.send.len()` elements of
                            // this device (plan checked), alive until the copy.
                            unsafe {
                                cudarc::driver::result::memcpy_dtod_async(
                                    dst,
                                    src,
                                    x.send.len() * size,
                                    stream.cu_stream(),
                                )
                            }
                            .map_err(NcclError::on_cuda("cuMemcpyDtoDAsync"))?;
                            continue;
                        }
                        // SAFETY: the blocks hold `x.send.len()` and
                        // `x.recv.len()` elements (plan checked), alive until
                        // the stream reaches the group; the peer is a rank.
                        unsafe {
                            raw.send(src, x.send.len() * size, x.peer, &stream)?;
                            raw.recv(dst, x.recv.len() * size, x.peer, &stream)
                        }?;
                    }
                    Ok(())
                })
            },
        )
    }
}
