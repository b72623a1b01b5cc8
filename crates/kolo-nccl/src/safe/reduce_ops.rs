//! The reductions of [`NcclComm`] on device memory: allreduce (in and out
//! of place) and reduce-scatter. Each runs its [`ReducePlan`]: the scale
//! kernel on the input when the plan has a prescale (in place, into the
//! receive buffer, or into scratch memory so the caller's send buffer is
//! never written), the NCCL operation, and the scale kernel on the result
//! when it has a postscale — all on the communication stream.

use crate::error::NcclError;
use crate::plan;
use crate::reduce_plan::plan_reduce;
use crate::safe::comm::NcclComm;
use crate::safe::raw_comm::grouped;
use crate::safe::work::Work;
use cudarc::driver::{DevicePtr, DevicePtrMut};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Element, Scale, Topology};

impl NcclComm {
    /// In place: `buf = postscale * op_r(prescale * buf_r)` over all ranks
    /// (averages divide the postscale by the number of ranks), with kolo's
    /// element semantics for every dtype but u16 / i16.
    pub fn all_reduce<T: Element>(
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
        if let Some(algorithm) = self.peer_algorithm(dtype, count, op, scale) {
            return self.peer_all_reduce(buf, algorithm, dtype, count, op, scale);
        }
        self.prepare_kernels(&plan)?;
        self.run(
            format!("allreduce({}) of {count} {dtype}", op.name()),
            |comm| {
                if count == 0 {
                    return Ok(());
                }
                let stream = comm.device.stream().clone();
                let (ptr, _written) = buf.device_ptr_mut(&stream);
                if let Some(factor) = plan.prescale {
                    // SAFETY: `ptr` holds `count` elements of `dtype` on this
                    // device (checked), alive until the stream reaches the
                    // kernel (cudarc's events, recorded when the guard drops).
                    unsafe { comm.scale_on_stream(dtype, ptr, ptr, count, factor) }?;
                }
                let raw = comm.raw()?;
                let op = raw.reduction(&plan)?;
                // SAFETY: as above, for the NCCL call; `op` is `raw`'s and
                // outlives the call.
                unsafe { raw.all_reduce(ptr, ptr, count, plan.dtype, &op, &stream) }?;
                drop(op);
                if let Some(factor) = plan.postscale {
                    // SAFETY: as for the prescale.
                    unsafe { comm.scale_on_stream(dtype, ptr, ptr, count, factor) }?;
                }
                Ok(())
            },
        )
    }

    /// Out of place: `recv = op_r(send_r)`, scaled as [`Self::all_reduce`];
    /// `send` is only read.
    pub fn all_reduce_into<T: Element>(
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
        self.prepare_kernels(&plan)?;
        let count = send.len();
        self.run(
            format!("allreduce({}) of {count} {}", op.name(), T::DTYPE),
            |comm| {
                if count == 0 {
                    return Ok(());
                }
                let stream = comm.device.stream().clone();
                let (s, _read) = send.device_ptr(&stream);
                let (r, _written) = recv.device_ptr_mut(&stream);
                let input = match plan.prescale {
                    Some(factor) => {
                        // SAFETY: both hold `count` elements of `T` on this
                        // device (checked) and are distinct buffers (one is
                        // borrowed mutably), alive until the stream reaches
                        // the kernel (cudarc's events).
                        unsafe { comm.scale_on_stream(T::DTYPE, r, s, count, factor) }?;
                        r
                    }
                    None => s,
                };
                let raw = comm.raw()?;
                let op = raw.reduction(&plan)?;
                // SAFETY: as above, for the NCCL call (in place on `r` after
                // a prescale); `op` is `raw`'s and outlives the call.
                unsafe { raw.all_reduce(input, r, count, plan.dtype, &op, &stream) }?;
                drop(op);
                if let Some(factor) = plan.postscale {
                    // SAFETY: `r` holds `count` elements (checked).
                    unsafe { comm.scale_on_stream(T::DTYPE, r, r, count, factor) }?;
                }
                Ok(())
            },
        )
    }

    /// Reduces every rank's `send` (`sum(counts)` elements) and leaves block
    /// `rank` (`counts[rank]` elements) in `recv`, scaled as in
    /// [`Self::all_reduce`]. Even counts use `ncclReduceScatter`, uneven
    /// ones one grouped `ncclReduce` per block.
    pub fn reduce_scatter<T: Element>(
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
        self.prepare_kernels(&plan)?;
        let total: usize = counts.iter().sum();
        self.run(
            format!("reduce_scatter({}) of {total} {dtype}", op.name()),
            |comm| {
                if total == 0 {
                    return Ok(());
                }
                let stream = comm.device.stream().clone();
                let (s, _read) = send.device_ptr(&stream);
                let (r, _written) = recv.device_ptr_mut(&stream);
                // The scaled input goes to scratch memory, freed in stream
                // order after the NCCL call (dropped at the end).
                let (scratch, input) = match plan.prescale {
                    Some(factor) => {
                        let (buf, ptr) = comm.scratch(total * elem)?;
                        // SAFETY: `s` holds `total` elements (checked), the
                        // scratch as many; both stay alive until the stream
                        // reaches the kernel.
                        unsafe { comm.scale_on_stream(dtype, ptr, s, total, factor) }?;
                        (Some(buf), ptr)
                    }
                    None => (None, s),
                };
                let raw = comm.raw()?;
                let op = raw.reduction(&plan)?;
                if let Some(count) = plan::even(counts) {
                    // SAFETY: `input` holds `size * count`, `r` `count`
                    // elements of this device (checked), alive until the
                    // stream reaches the call; `op` is `raw`'s.
                    unsafe { raw.reduce_scatter(input, r, count, plan.dtype, &op, &stream) }?;
                } else {
                    grouped(|| {
                        for (root, (&count, &offset)) in counts
                            .iter()
                            .zip(&offsets)
                            .enumerate()
                            .filter(|(_, (&c, _))| c > 0)
                        {
                            let block = input + (offset * elem) as u64;
                            // SAFETY: block `root` of `input` holds `count`
                            // elements (checked); `r` is written on the root
                            // only, where it holds `count` elements; `root`
                            // is a rank; `op` outlives the group.
                            unsafe { raw.reduce(block, r, count, plan.dtype, &op, root, &stream) }?;
                        }
                        Ok(())
                    })?;
                }
                drop(op);
                if let Some(factor) = plan.postscale {
                    // SAFETY: `r` holds `block` elements (checked).
                    unsafe { comm.scale_on_stream(dtype, r, r, block, factor) }?;
                }
                drop(scratch);
                Ok(())
            },
        )
    }
}
