//! The device data plane of [`NcclComm`]: collectives and point-to-point
//! operations on CUDA memory (cudarc's `CudaSlice`, `CudaView`,
//! `CudaViewMut`). Each call validates its arguments, enqueues NCCL work on
//! the communicator's stream (after GPU-side waits for the buffers' last
//! writes, through cudarc's per-buffer events) and returns a [`Work`].
//!
//! Counts are in elements. Data movement (all-gather, broadcast, send /
//! recv, alltoallv) moves bytes, so every [`DeviceElement`] works;
//! reductions follow [`crate::reduce_plan`].

use crate::comm::NcclComm;
use crate::error::NcclError;
use crate::plan;
use crate::raw_comm::{grouped, PreMulSum, RawComm};
use crate::reduce_plan::{plan_reduce, scalar_bytes, ReduceKind, ReducePlan};
use crate::result;
use crate::sys;
use crate::work::Work;
use cudarc::driver::{
    sys::CUdeviceptr, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, ValidAsZeroBits,
};
use kolo_protocol::DataType;
use kolo_protocol::ReduceOp;
use kolo_transport::{Element, Scale, Topology};
use std::ffi::{c_int, c_void};

/// An element kolo can move through NCCL on the device: a kolo
/// [`Element`] cudarc can hold (and zero) in device memory — all of them.
pub trait DeviceElement: Element + DeviceRepr + ValidAsZeroBits {}
impl<T: Element + DeviceRepr + ValidAsZeroBits> DeviceElement for T {}

/// A device address as NCCL's `void*`.
pub(crate) fn dev(p: CUdeviceptr) -> *mut c_void {
    p as usize as *mut c_void
}

/// `p` advanced by `elements` of `T`.
pub(crate) fn byte_offset<T>(p: CUdeviceptr, elements: usize) -> CUdeviceptr {
    p + (elements * std::mem::size_of::<T>()) as u64
}

pub(crate) fn c_rank(r: usize) -> c_int {
    // Ranks were checked against the communicator's size, which fit an int
    // when NCCL accepted it.
    r as c_int
}

/// Runs `call` with the NCCL operation of `plan`, creating (and destroying
/// afterwards) a PreMulSum when the plan needs one.
pub(crate) fn with_op(
    raw: &RawComm,
    plan: ReducePlan,
    call: impl FnOnce(sys::RedOp) -> Result<(), NcclError>,
) -> Result<(), NcclError> {
    match plan.kind {
        ReduceKind::Native(op) => call(op),
        ReduceKind::PreMulSum(factor) => {
            let op = PreMulSum::new(raw, scalar_bytes(plan.dtype, factor), plan.dtype)?;
            call(op.op())
        }
    }
}

impl NcclComm {
    /// Fails unless `buf` lives on this communicator's device.
    pub(crate) fn check_device<T>(
        &self,
        buf: &impl DeviceSlice<T>,
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

    pub(crate) fn check_peer(&self, peer: usize, what: &str) -> Result<(), NcclError> {
        if peer >= self.size() {
            return Err(NcclError::InvalidArgument(format!(
                "{what}: rank {peer} of a {}-rank communicator",
                self.size()
            )));
        }
        Ok(())
    }

    /// In place: `buf = postscale * op_r(prescale * buf_r)` over all ranks.
    pub fn all_reduce<T: DeviceElement>(
        &mut self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<Work, NcclError> {
        self.check_device(buf, "allreduce buffer")?;
        let count = buf.len();
        self.all_reduce_dyn(buf, T::DTYPE, count, op, scale)
    }

    /// In-place allreduce of `count` elements of the run-time `dtype` held
    /// in `buf` (whatever its static element type).
    pub(crate) fn all_reduce_dyn<U>(
        &mut self,
        buf: &mut impl DevicePtrMut<U>,
        dtype: DataType,
        count: usize,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<Work, NcclError> {
        if count * dtype.size() > buf.num_bytes() {
            return Err(NcclError::InvalidArgument(format!(
                "allreduce of {count} {dtype} in a buffer of {} bytes",
                buf.num_bytes()
            )));
        }
        let plan = plan_reduce(dtype, op, scale, self.size())?;
        self.run(
            format!("allreduce({}) of {count} {dtype}", op.name()),
            |comm| {
                if count == 0 {
                    return Ok(());
                }
                let stream = comm.device.stream().clone();
                let raw = comm.raw()?;
                let (ptr, _written) = buf.device_ptr_mut(&stream);
                with_op(raw, plan, |op| {
                    // SAFETY: `ptr` holds at least `count` elements of `dtype`
                    // (checked) on this device, kept alive until the stream
                    // reaches the call by cudarc's events (the guard records
                    // them after it); `op` is valid for `raw`.
                    unsafe {
                        result::all_reduce(
                            dev(ptr),
                            dev(ptr),
                            count,
                            plan.dtype,
                            op,
                            raw.handle(),
                            stream.cu_stream(),
                        )
                    }
                })
            },
        )
    }

    /// Out of place: `recv = op_r(send_r)`, scaled as [`Self::all_reduce`].
    pub fn all_reduce_into<T: DeviceElement>(
        &mut self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<Work, NcclError> {
        self.check_device(send, "allreduce send buffer")?;
        self.check_device(recv, "allreduce recv buffer")?;
        if send.len() != recv.len() {
            return Err(NcclError::InvalidArgument(format!(
                "allreduce: send holds {} elements, recv {}",
                send.len(),
                recv.len()
            )));
        }
        let plan = plan_reduce(T::DTYPE, op, scale, self.size())?;
        let count = send.len();
        self.run(
            format!("allreduce({}) of {count} {}", op.name(), T::DTYPE),
            |comm| {
                if count == 0 {
                    return Ok(());
                }
                let stream = comm.device.stream().clone();
                let raw = comm.raw()?;
                let (s, _read) = send.device_ptr(&stream);
                let (r, _written) = recv.device_ptr_mut(&stream);
                with_op(raw, plan, |op| {
                    // SAFETY: as in `all_reduce`, for both buffers.
                    unsafe {
                        result::all_reduce(
                            dev(s),
                            dev(r),
                            count,
                            plan.dtype,
                            op,
                            raw.handle(),
                            stream.cu_stream(),
                        )
                    }
                })
            },
        )
    }

    /// The root's `buf` is copied into every rank's `buf`.
    pub fn broadcast<T: DeviceElement>(
        &mut self,
        buf: &mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<Work, NcclError> {
        self.check_device(buf, "broadcast buffer")?;
        self.check_peer(root, "broadcast root")?;
        let bytes = buf.num_bytes();
        self.run(
            format!("broadcast of {} {} from rank {root}", buf.len(), T::DTYPE),
            |comm| {
                if bytes == 0 {
                    return Ok(());
                }
                let stream = comm.device.stream().clone();
                let handle = comm.handle()?;
                let (ptr, _written) = buf.device_ptr_mut(&stream);
                // SAFETY: `ptr` holds `bytes` bytes of this device, alive until
                // the stream reaches the call (cudarc's events); root checked.
                unsafe {
                    result::broadcast(
                        dev(ptr),
                        dev(ptr),
                        bytes,
                        sys::dtype::UINT8,
                        c_rank(root),
                        handle,
                        stream.cu_stream(),
                    )
                }
            },
        )
    }

    /// Even all-gather: `recv` (`size * send.len()` elements) receives every
    /// rank's `send` in rank order. Runs on the copy engines when enabled.
    pub fn all_gather<T: DeviceElement>(
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
    pub fn all_gatherv<T: DeviceElement>(
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
                let handle = comm.handle()?;
                if let Some(count) = even {
                    // SAFETY: `s` holds `count`, `r` `size * count` elements of
                    // this device (checked), alive until the stream reaches the
                    // call (cudarc's events).
                    return unsafe {
                        result::all_gather(
                            dev(s),
                            dev(r),
                            count * size,
                            sys::dtype::UINT8,
                            handle,
                            stream.cu_stream(),
                        )
                    };
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
                        unsafe {
                            result::broadcast(
                                dev(s),
                                dev(dst),
                                count * size,
                                sys::dtype::UINT8,
                                c_rank(root),
                                handle,
                                stream.cu_stream(),
                            )
                        }?;
                    }
                    Ok(())
                })
            },
        )
    }

    /// Reduces every rank's `send` (`sum(counts)` elements) and leaves block
    /// `rank` (`counts[rank]` elements) in `recv`, scaled as in
    /// [`Self::all_reduce`]. Even counts use `ncclReduceScatter`, uneven
    /// ones one grouped `ncclReduce` per block.
    pub fn reduce_scatter<T: DeviceElement>(
        &mut self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<Work, NcclError> {
        self.check_device(send, "reduce_scatter send buffer")?;
        self.check_device(recv, "reduce_scatter recv buffer")?;
        plan::reduce_scatter(self.rank(), self.size(), send.len(), recv.len(), counts)?;
        self.reduce_scatter_dyn(send, recv, T::DTYPE, counts, op, scale)
    }

    /// Reduce-scatter of the run-time `dtype`; `counts` in elements.
    pub(crate) fn reduce_scatter_dyn<U>(
        &mut self,
        send: &impl DevicePtr<U>,
        recv: &mut impl DevicePtrMut<U>,
        dtype: DataType,
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<Work, NcclError> {
        let elem = dtype.size();
        // `recv` may be larger than its block (padded staging buffers): it
        // is checked to hold at least `counts[rank]` elements.
        let block = counts.get(self.rank()).copied().unwrap_or(0);
        let offsets = plan::reduce_scatter(
            self.rank(),
            self.size(),
            send.num_bytes() / elem,
            block.min(recv.num_bytes() / elem),
            counts,
        )?;
        let plan = plan_reduce(dtype, op, scale, self.size())?;
        let total: usize = counts.iter().sum();
        self.run(
            format!("reduce_scatter({}) of {total} {dtype}", op.name()),
            |comm| {
                if total == 0 {
                    return Ok(());
                }
                let stream = comm.device.stream().clone();
                let raw = comm.raw()?;
                let (s, _read) = send.device_ptr(&stream);
                let (r, _written) = recv.device_ptr_mut(&stream);
                with_op(raw, plan, |op| {
                    if let Some(count) = plan::even(counts) {
                        // SAFETY: `s` holds `size * count`, `r` `count` elements
                        // of this device (checked), alive until the stream
                        // reaches the call; `op` is valid for `raw`.
                        return unsafe {
                            result::reduce_scatter(
                                dev(s),
                                dev(r),
                                count,
                                plan.dtype,
                                op,
                                raw.handle(),
                                stream.cu_stream(),
                            )
                        };
                    }
                    grouped(|| {
                        for (root, (&count, &offset)) in counts
                            .iter()
                            .zip(&offsets)
                            .enumerate()
                            .filter(|(_, (&c, _))| c > 0)
                        {
                            // SAFETY: block `root` of `send` holds `count`
                            // elements (checked); `r` is written on the root
                            // only, where it holds `count` elements.
                            unsafe {
                                result::reduce(
                                    dev(s + (offset * elem) as u64),
                                    dev(r),
                                    count,
                                    plan.dtype,
                                    op,
                                    c_rank(root),
                                    raw.handle(),
                                    stream.cu_stream(),
                                )
                            }?;
                        }
                        Ok(())
                    })
                })
            },
        )
    }

    /// `send` holds `send_counts[p]` elements for each peer p in peer
    /// order; `recv` receives `recv_counts[p]` from each peer p. Grouped
    /// `ncclSend` / `ncclRecv`; this rank's own block is a local copy.
    pub fn all_to_allv<T: DeviceElement>(
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
                let handle = comm.handle()?;
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
                        if !x.send.is_empty() {
                            // SAFETY: the block holds `x.send.len()` elements (plan).
                            unsafe {
                                result::send(
                                    dev(src),
                                    x.send.len() * size,
                                    sys::dtype::UINT8,
                                    c_rank(x.peer),
                                    handle,
                                    stream.cu_stream(),
                                )
                            }?;
                        }
                        if !x.recv.is_empty() {
                            // SAFETY: the block holds `x.recv.len()` elements (plan).
                            unsafe {
                                result::recv(
                                    dev(dst),
                                    x.recv.len() * size,
                                    sys::dtype::UINT8,
                                    c_rank(x.peer),
                                    handle,
                                    stream.cu_stream(),
                                )
                            }?;
                        }
                    }
                    Ok(())
                })
            },
        )
    }
}
