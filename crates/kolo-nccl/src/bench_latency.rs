//! Where the time of one small allreduce goes: the host call, the device
//! time per operation back to back through kolo and through bare
//! `ncclAllReduce` calls (no kolo bookkeeping, no cudarc events), and call
//! to completion. Part of [`crate::bench`].

use super::median;
use crate::comm::NcclComm;
use crate::error::NcclError;
use crate::ops::dev;
use crate::result;
use crate::sys;
use crate::work::Work;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaStream, DevicePtrMut};
use kolo_protocol::ReduceOp;
use kolo_transport::Scale;
use std::time::{Duration, Instant};

/// One small f32 sum allreduce, decomposed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyBreakdown {
    /// Bytes per operation.
    pub bytes: usize,
    /// Median host time of one `NcclComm::all_reduce` call (enqueue only).
    pub call: Duration,
    /// GPU time per operation, `iters` enqueued back to back through kolo,
    /// on a buffer without cudarc's event tracking.
    pub device: Duration,
    /// The same on an event-tracked buffer: cudarc adds two stream waits
    /// and an event record per call.
    pub device_tracked: Duration,
    /// The same with bare `ncclAllReduce` calls on the stream: NCCL's floor
    /// on this machine and mode.
    pub device_raw: Duration,
    /// Median host time from the call to the completion of its [`Work`].
    pub complete: Duration,
}

/// GPU time per iteration of `iters` runs of `once` enqueued back to back
/// (after `warmup`), between two events on `stream`.
fn device_time(
    comm: &mut NcclComm,
    stream: &CudaStream,
    warmup: usize,
    iters: usize,
    once: &mut dyn FnMut(&mut NcclComm) -> Result<(), NcclError>,
) -> Result<Duration, NcclError> {
    for _ in 0..warmup {
        once(comm)?;
    }
    let ctx = comm.device().context().clone();
    let event = || {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(NcclError::on_cuda("cuEventCreate"))
    };
    let (start, end) = (event()?, event()?);
    start
        .record(stream)
        .map_err(NcclError::on_cuda("cuEventRecord"))?;
    for _ in 0..iters {
        once(comm)?;
    }
    end.record(stream)
        .map_err(NcclError::on_cuda("cuEventRecord"))?;
    comm.flush()?.wait()?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(NcclError::on_cuda("cuEventElapsedTime"))?;
    Ok(Duration::from_secs_f64(
        f64::from(ms) / 1e3 / iters.max(1) as f64,
    ))
}

/// Measures [`LatencyBreakdown`] for `bytes` (f32) over `iters` operations
/// after `warmup`. Collective.
pub fn latency_breakdown(
    comm: &mut NcclComm,
    bytes: usize,
    warmup: usize,
    iters: usize,
) -> Result<LatencyBreakdown, NcclError> {
    let stream = comm.stream().clone();
    let count = (bytes / 4).max(1);
    let alloc = || {
        stream
            .alloc_zeros::<f32>(count)
            .map_err(NcclError::on_cuda("cuMemAllocAsync"))
    };
    // SAFETY: `buf` is used on the communication stream only and dropped
    // at the end of this function.
    let mut buf = unsafe { super::untracked(comm, alloc) }?;
    let mut tracked = alloc()?;
    let ptr = {
        let (ptr, _written) = buf.device_ptr_mut(&stream);
        ptr
    };
    comm.flush()?.wait()?;
    let mut calls = Vec::with_capacity(iters);
    let mut last: Option<Work> = None;
    let device = device_time(comm, &stream, warmup, iters, &mut |comm| {
        let start = Instant::now();
        last = Some(comm.all_reduce(&mut buf, ReduceOp::Sum, Scale::NONE)?);
        calls.push(start.elapsed());
        Ok(())
    })?;
    if let Some(work) = last.take() {
        work.wait()?;
    }
    let device_tracked = device_time(comm, &stream, warmup, iters, &mut |comm| {
        comm.all_reduce(&mut tracked, ReduceOp::Sum, Scale::NONE)
            .map(drop)
    })?;
    let device_raw = device_time(comm, &stream, warmup, iters, &mut |comm| {
        let handle = comm.handle()?;
        // SAFETY: `ptr` is `buf`'s address (`count` f32 on this device),
        // alive until the end of this function, and used on this stream
        // only meanwhile.
        unsafe {
            result::all_reduce(
                dev(ptr),
                dev(ptr),
                count,
                sys::dtype::FLOAT32,
                sys::op::SUM,
                handle,
                stream.cu_stream(),
            )
        }
    })?;
    let mut completes = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let start = Instant::now();
        comm.all_reduce(&mut buf, ReduceOp::Sum, Scale::NONE)?
            .wait()?;
        if i >= warmup {
            completes.push(start.elapsed());
        }
    }
    let skip = calls.len().saturating_sub(iters);
    Ok(LatencyBreakdown {
        bytes: count * 4,
        call: median(calls.split_off(skip)),
        device,
        device_tracked,
        device_raw,
        complete: median(completes),
    })
}
