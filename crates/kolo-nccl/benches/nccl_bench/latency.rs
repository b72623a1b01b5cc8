//! Where the time of one small allreduce goes: the host call, the time
//! per operation back to back through kolo and through bare
//! `ncclAllReduce` calls (no kolo bookkeeping, no cudarc events:
//! [`NcclComm::bare_all_reduce`]), with the pieces of kolo's bookkeeping
//! added one at a time, and call to completion.
//!
//! Two clocks. `device*` fields time `iters` operations enqueued back to
//! back between two events on the stream (GPU clock); `loop_*` fields do
//! what nccl-tests does: host clock around `iters` back-to-back operations
//! and one stream synchronize at the end, divided by `iters`. For small
//! messages both measure how fast the host enqueues.

use crate::ops::{median, untracked};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaStream;
use kolo_nccl::{Bare, NcclComm, NcclError, Work};
use kolo_protocol::ReduceOp;
use kolo_transport::Scale;
use std::time::{Duration, Instant};

/// One small f32 sum allreduce, decomposed (medians over rounds).
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
    /// Bare `ncclAllReduce` plus one pooled event record per call (what
    /// tracking an operation's completion costs the enqueuing thread).
    pub device_raw_event: Duration,
    /// Bare `ncclAllReduce` plus kolo's tracking (event record, a
    /// [`Work`] handed to the completion thread, which polls it).
    pub device_raw_tracked: Duration,
    /// nccl-tests' way, through kolo: host clock over `iters` back-to-back
    /// calls and one stream synchronize, per operation.
    pub loop_kolo: Duration,
    /// nccl-tests' way with bare `ncclAllReduce` calls.
    pub loop_raw: Duration,
    /// Median host time from the call to the completion of its [`Work`].
    pub complete: Duration,
}

/// Rounds of every back-to-back measurement (interleaved, median kept).
const ROUNDS: usize = 5;

/// `iters` runs of `once` after `warmup`, timed per operation on the GPU
/// (between two events on `stream`) and on the host (nccl-tests: host
/// clock to the end of one stream synchronize).
fn back_to_back(
    comm: &mut NcclComm,
    stream: &CudaStream,
    warmup: usize,
    iters: usize,
    once: &mut dyn FnMut(&mut NcclComm) -> Result<(), NcclError>,
) -> Result<(Duration, Duration), NcclError> {
    for _ in 0..warmup {
        once(comm)?;
    }
    comm.device().synchronize()?;
    let ctx = comm.device().context().clone();
    let event = || {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(NcclError::on_cuda("cuEventCreate"))
    };
    let (start, end) = (event()?, event()?);
    let host = Instant::now();
    start
        .record(stream)
        .map_err(NcclError::on_cuda("cuEventRecord"))?;
    for _ in 0..iters {
        once(comm)?;
    }
    end.record(stream)
        .map_err(NcclError::on_cuda("cuEventRecord"))?;
    comm.device().synchronize()?;
    let host = host.elapsed() / iters.max(1) as u32;
    // Everything tracked so far completes before the next measurement.
    comm.flush()?.wait()?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(NcclError::on_cuda("cuEventElapsedTime"))?;
    let device = Duration::from_secs_f64(f64::from(ms) / 1e3 / iters.max(1) as f64);
    Ok((device, host))
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
    let mut buf = unsafe { untracked(comm, alloc) }?;
    let mut tracked = alloc()?;
    comm.flush()?.wait()?;
    let mut calls = Vec::with_capacity(iters * ROUNDS);
    // Per variant: (device, loop) samples of each round.
    let mut samples: [Vec<(Duration, Duration)>; 5] = Default::default();
    for _ in 0..ROUNDS {
        let mut last: Option<Work> = None;
        samples[0].push(back_to_back(comm, &stream, warmup, iters, &mut |comm| {
            let start = Instant::now();
            last = Some(comm.all_reduce(&mut buf, ReduceOp::Sum, Scale::NONE)?);
            calls.push(start.elapsed());
            Ok(())
        })?);
        if let Some(work) = last.take() {
            work.wait()?;
        }
        samples[1].push(back_to_back(comm, &stream, warmup, iters, &mut |comm| {
            comm.all_reduce(&mut tracked, ReduceOp::Sum, Scale::NONE)
                .map(drop)
        })?);
        for (slot, then) in [(2, Bare::Call), (3, Bare::RecordEvent), (4, Bare::Track)] {
            samples[slot].push(back_to_back(comm, &stream, warmup, iters, &mut |comm| {
                comm.bare_all_reduce(&mut buf, then)
            })?);
        }
    }
    let mut completes = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let start = Instant::now();
        comm.all_reduce(&mut buf, ReduceOp::Sum, Scale::NONE)?
            .wait()?;
        if i >= warmup {
            completes.push(start.elapsed());
        }
    }
    let device = |i: usize| median(samples[i].iter().map(|s| s.0).collect());
    let looped = |i: usize| median(samples[i].iter().map(|s| s.1).collect());
    Ok(LatencyBreakdown {
        bytes: count * 4,
        call: median(calls),
        device: device(0),
        device_tracked: device(1),
        device_raw: device(2),
        device_raw_event: device(3),
        device_raw_tracked: device(4),
        loop_kolo: looped(0),
        loop_raw: looped(2),
        complete: median(completes),
    })
}
