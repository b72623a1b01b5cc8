//! Timed operations on device buffers, the same in both modes (build the
//! [`NcclComm`] however, then call the same function on every rank):
//! [`time_op`] for nccl-tests-style bandwidths over [`SIZES`], [`latency`]
//! for one small allreduce, [`step`] for a step of many small gradients
//! fused in a [`DeviceFusionBuffer`] against one allreduce of the same
//! bytes. Every function is collective.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaSlice;
use kolo_nccl::{CopyEngine, DeviceFusionBuffer, NcclComm, NcclError, Work};
use kolo_protocol::ReduceOp;
use kolo_transport::{Scale, Topology};
use std::time::{Duration, Instant};

/// The sizes of the bandwidth tables: 8 B to 1 GiB.
pub const SIZES: [usize; 6] = [8, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30];

/// The operations [`time_op`] measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchOp {
    /// In-place f32 sum allreduce of the whole buffer.
    AllReduce,
    /// Even all-gather; the size is the gathered array.
    AllGather,
    /// Even reduce-scatter (sum); the size is the input array.
    ReduceScatter,
    /// Broadcast from rank 0.
    Broadcast,
    /// Ring exchange: send to rank + 1, receive from rank - 1.
    SendRecv,
    /// Even all-to-all; the size is each rank's send buffer.
    AllToAll,
}

impl BenchOp {
    /// Every operation.
    pub const ALL: [BenchOp; 6] = [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::Broadcast,
        BenchOp::SendRecv,
        BenchOp::AllToAll,
    ];

    /// nccl-tests' name.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Broadcast => "broadcast",
            BenchOp::SendRecv => "sendrecv",
            BenchOp::AllToAll => "alltoall",
        }
    }

    /// busbw / algbw on `ranks` ranks: 2(n-1)/n for allreduce, (n-1)/n for
    /// all-gather, reduce-scatter and all-to-all, 1 otherwise.
    pub fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks.max(1) as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::SendRecv => 1.0,
        }
    }
}

/// One measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BenchResult {
    /// The operation.
    pub op: BenchOp,
    /// Bytes of the measured array (rounded down to whole f32 blocks).
    pub bytes: usize,
    /// Timed iterations.
    pub iters: usize,
    /// GPU time per iteration (between events on the communication stream).
    pub time: Duration,
    /// bytes / time, in GB/s (1e9 bytes).
    pub algbw: f64,
    /// algbw times [`BenchOp::bus_factor`].
    pub busbw: f64,
}

/// Elements of f32 for `bytes` of `op` on `n` ranks: divisible by `n`
/// where the operation splits the array, at least one block.
pub fn elements_for(op: BenchOp, bytes: usize, n: usize) -> usize {
    let n = n.max(1);
    let elements = (bytes / 4).max(1);
    match op {
        BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll => {
            (elements / n).max(1) * n
        }
        _ => elements,
    }
}

/// Times `iters` back-to-back runs of `op` on about `bytes` of f32 after
/// `warmup` untimed runs. Collective: every rank calls it with the same
/// arguments. The time is measured on the GPU between two timing events on
/// the communication stream.
pub fn time_op(
    comm: &mut NcclComm,
    op: BenchOp,
    bytes: usize,
    warmup: usize,
    iters: usize,
) -> Result<BenchResult, NcclError> {
    let n = comm.size();
    let elements = elements_for(op, bytes, n);
    let stream = comm.stream().clone();
    let alloc = |len: usize| {
        stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(NcclError::on_cuda("cuMemAllocAsync"))
    };
    let mut a = alloc(elements)?;
    let mut b = alloc(elements)?;
    let (rank, right, left) = (
        comm.rank(),
        (comm.rank() + 1) % n,
        (comm.rank() + n - 1) % n,
    );
    let block = elements / n;
    let counts = vec![block; n];
    let mut once = |comm: &mut NcclComm| -> Result<Work, NcclError> {
        match op {
            BenchOp::AllReduce => comm.all_reduce(&mut a, ReduceOp::Sum, Scale::NONE),
            BenchOp::AllGather => {
                comm.all_gather(&a.slice(rank * block..(rank + 1) * block), &mut b)
            }
            BenchOp::ReduceScatter => comm.reduce_scatter(
                &a,
                &mut b.slice_mut(..block),
                &counts,
                ReduceOp::Sum,
                Scale::NONE,
            ),
            BenchOp::Broadcast => comm.broadcast(&mut a, 0),
            BenchOp::SendRecv if n == 1 => comm.flush(),
            // With copy engines on, point-to-point runs as a transaction
            // (the path that uses them).
            BenchOp::SendRecv if comm.copy_engine() == CopyEngine::On => {
                let mut tx = comm.begin()?;
                tx.send(&a, right)?.recv(&mut b, left)?;
                tx.execute()
            }
            BenchOp::SendRecv => comm.send_recv(&a, right, &mut b, left),
            BenchOp::AllToAll => comm.all_to_allv(&a, &counts, &mut b, &counts),
        }
    };
    for _ in 0..warmup {
        once(comm)?;
    }
    let ctx = comm.device().context().clone();
    let start = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(NcclError::on_cuda("cuEventCreate"))?;
    let end = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(NcclError::on_cuda("cuEventCreate"))?;
    start
        .record(&stream)
        .map_err(NcclError::on_cuda("cuEventRecord"))?;
    let mut last = None;
    for _ in 0..iters {
        last = Some(once(comm)?);
    }
    end.record(&stream)
        .map_err(NcclError::on_cuda("cuEventRecord"))?;
    if let Some(work) = last {
        work.wait()?;
    }
    let ms = start
        .elapsed_ms(&end)
        .map_err(NcclError::on_cuda("cuEventElapsedTime"))?;
    let time = Duration::from_secs_f64(f64::from(ms) / 1e3 / iters.max(1) as f64);
    let bytes = elements * 4;
    let algbw = bytes as f64 / time.as_secs_f64().max(1e-12) / 1e9;
    Ok(BenchResult {
        op,
        bytes,
        iters,
        time,
        algbw,
        busbw: algbw * op.bus_factor(n),
    })
}

/// The median of `samples` (zero when empty).
pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    match samples.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => samples[n / 2],
        n => (samples[n / 2 - 1] + samples[n / 2]) / 2,
    }
}

/// Host-clock latency of one `bytes` f32 sum allreduce, from the call to
/// its completion ([`Work::wait`]), median of `iters` after
/// `warmup`. Collective.
pub fn latency(
    comm: &mut NcclComm,
    bytes: usize,
    warmup: usize,
    iters: usize,
) -> Result<Duration, NcclError> {
    let mut buf = comm
        .stream()
        .alloc_zeros::<f32>((bytes / 4).max(1))
        .map_err(NcclError::on_cuda("cuMemAllocAsync"))?;
    comm.flush()?.wait()?;
    let mut samples = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let start = Instant::now();
        comm.all_reduce(&mut buf, ReduceOp::Sum, Scale::NONE)?
            .wait()?;
        if i >= warmup {
            samples.push(start.elapsed());
        }
    }
    Ok(median(samples))
}

/// One training step of `tensors` gradients of `tensor_bytes` each
/// (f32), host-clock medians from the first call to the completion of the
/// last operation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepResult {
    /// Gradients per step.
    pub tensors: usize,
    /// Bytes per gradient.
    pub tensor_bytes: usize,
    /// Packed into a [`DeviceFusionBuffer`] (one batched copy launch), one
    /// allreduce, unpacked (one launch); gradients allocated without
    /// cudarc's event tracking (the caller orders the streams).
    pub fused: Duration,
    /// The same with event-tracked gradients: cudarc adds a stream wait
    /// and an event record per gradient and copy.
    pub fused_tracked: Duration,
    /// Median host time of the `pack` call (untracked gradients).
    pub pack_call: Duration,
    /// Median host time of the `unpack` call (untracked gradients).
    pub unpack_call: Duration,
    /// One allreduce per gradient.
    pub separate: Duration,
    /// One allreduce of all the bytes in one buffer (the floor).
    pub single: Duration,
}

/// Runs `alloc` with cudarc's event tracking off in `comm`'s context (and
/// restores it): what it allocates carries no per-buffer events.
///
/// # Safety
/// The buffers allocated are used on the communication stream only (or
/// the caller orders the streams itself), and freed in its order.
pub unsafe fn untracked<R>(comm: &NcclComm, alloc: impl FnOnce() -> R) -> R {
    let ctx = comm.device().context().clone();
    let was = ctx.is_event_tracking();
    // SAFETY: per the caller's contract, only the buffers allocated now
    // lose their events; tracking comes back right after.
    unsafe { ctx.disable_event_tracking() };
    let out = alloc();
    if was {
        // SAFETY: restores the setting found above.
        unsafe { ctx.enable_event_tracking() };
    }
    out
}

/// Median host time of `iters` runs of `run` after `warmup`, each from the
/// first call to the completion of everything it enqueued.
fn timed(
    comm: &mut NcclComm,
    warmup: usize,
    iters: usize,
    run: &mut dyn FnMut(&mut NcclComm) -> Result<(), NcclError>,
) -> Result<Duration, NcclError> {
    let mut samples = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let start = Instant::now();
        run(comm)?;
        comm.flush()?.wait()?;
        if i >= warmup {
            samples.push(start.elapsed());
        }
    }
    Ok(median(samples))
}

/// Pack, one allreduce, unpack of `grads` through `fusion`; returns the
/// host time of the pack and unpack calls.
fn fused_step(
    comm: &mut NcclComm,
    fusion: &mut DeviceFusionBuffer,
    grads: &mut [CudaSlice<f32>],
) -> Result<(Duration, Duration), NcclError> {
    let views: Vec<_> = grads.iter().map(|g| g.slice(..)).collect();
    let start = Instant::now();
    let count = fusion.pack(comm, &views)?;
    let pack = start.elapsed();
    drop(views);
    fusion.all_reduce::<f32>(comm, count, ReduceOp::Sum, Scale::NONE)?;
    let mut outs: Vec<_> = grads.iter_mut().map(|g| g.slice_mut(..)).collect();
    let start = Instant::now();
    fusion.unpack(comm, &mut outs)?;
    Ok((pack, start.elapsed()))
}

/// Times [`StepResult`]'s ways over `iters` steps after `warmup`.
/// Collective.
pub fn step(
    comm: &mut NcclComm,
    tensors: usize,
    tensor_bytes: usize,
    warmup: usize,
    iters: usize,
) -> Result<StepResult, NcclError> {
    let stream = comm.stream().clone();
    let len = (tensor_bytes / 4).max(1);
    let alloc = |n: usize| {
        stream
            .alloc_zeros::<f32>(n)
            .map_err(NcclError::on_cuda("cuMemAllocAsync"))
    };
    let grads = || {
        (0..tensors)
            .map(|_| alloc(len))
            .collect::<Result<Vec<_>, _>>()
    };
    // SAFETY: every buffer below is used on the communication stream only
    // and dropped at the end of this function (freed in its order).
    let (mut fast, mut whole, mut fusion) = unsafe {
        untracked(comm, || -> Result<_, NcclError> {
            Ok((
                grads()?,
                alloc(len * tensors)?,
                DeviceFusionBuffer::new(comm, len * tensors * 4)?,
            ))
        })
    }?;
    let mut tracked = grads()?;
    comm.flush()?.wait()?;
    let (mut packs, mut unpacks) = (Vec::new(), Vec::new());
    let fused = timed(comm, warmup, iters, &mut |comm| {
        let (pack, unpack) = fused_step(comm, &mut fusion, &mut fast)?;
        packs.push(pack);
        unpacks.push(unpack);
        Ok(())
    })?;
    let fused_tracked = timed(comm, warmup, iters, &mut |comm| {
        fused_step(comm, &mut fusion, &mut tracked).map(drop)
    })?;
    let separate = timed(comm, warmup, iters, &mut |comm| {
        for g in fast.iter_mut() {
            comm.all_reduce(g, ReduceOp::Sum, Scale::NONE)?;
        }
        Ok(())
    })?;
    let single = timed(comm, warmup, iters, &mut |comm| {
        comm.all_reduce(&mut whole, ReduceOp::Sum, Scale::NONE)
            .map(drop)
    })?;
    Ok(StepResult {
        tensors,
        tensor_bytes: len * 4,
        fused,
        fused_tracked,
        pack_call: median(packs),
        unpack_call: median(unpacks),
        separate,
        single,
    })
}

/// The pure helpers' checks, run by `cargo test` (the bench target's test
/// mode): nccl-tests' bus factors, even element counts, medians.
pub fn self_check() -> Result<(), String> {
    let check = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
    let ms = Duration::from_millis;
    check(
        median(vec![ms(3), ms(1), ms(2)]) == ms(2),
        "median of three",
    )?;
    check(
        median(vec![ms(4), ms(1), ms(2), ms(3)]) == Duration::from_micros(2500),
        "median of four",
    )?;
    check(median(Vec::new()) == Duration::ZERO, "median of none")?;
    check(SIZES.last() == Some(&(1 << 30)), "sizes end at 1 GiB")?;
    check(
        BenchOp::AllReduce.bus_factor(2) == 1.0,
        "allreduce bus factor on 2",
    )?;
    check(
        BenchOp::AllReduce.bus_factor(4) == 1.5,
        "allreduce bus factor on 4",
    )?;
    check(
        BenchOp::AllGather.bus_factor(4) == 0.75,
        "allgather bus factor",
    )?;
    check(
        BenchOp::Broadcast.bus_factor(8) == 1.0,
        "broadcast bus factor",
    )?;
    check(
        BenchOp::AllToAll.bus_factor(1) == 0.0,
        "alltoall bus factor on 1",
    )?;
    check(
        elements_for(BenchOp::AllReduce, 8, 3) == 2,
        "allreduce elements",
    )?;
    check(
        elements_for(BenchOp::AllGather, 40, 3) == 9,
        "allgather elements",
    )?;
    check(
        elements_for(BenchOp::ReduceScatter, 4, 4) == 4,
        "reduce_scatter elements",
    )?;
    check(
        elements_for(BenchOp::Broadcast, 0, 2) == 1,
        "broadcast elements",
    )?;
    let names: Vec<_> = BenchOp::ALL.iter().map(|o| o.name()).collect();
    check(
        names
            == [
                "all_reduce",
                "all_gather",
                "reduce_scatter",
                "broadcast",
                "sendrecv",
                "alltoall",
            ],
        "nccl-tests' names",
    )
}
