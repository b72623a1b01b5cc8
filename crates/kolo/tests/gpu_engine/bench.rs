//! `--bench`: the fused step of 1,000 x 16 KiB device gradients of one
//! TensorGroup through the engine vs one 16 MiB allreduce through it, and
//! the 8-byte allreduce latency through the engine (rank 0 prints); then,
//! in the same run, the same on kolo-nccl directly, with the ratios.

use crate::checks::{caller_stream, upload};
use crate::Report;
use kolo::nccl::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use kolo::nccl::NcclOptions;
use kolo::{Kolo, ReduceOp, TensorGroup};
use kolo_nccl::{Cuda, CudaMut, CudaRef, NcclComm, UntrackedSpace};
use kolo_transport::{Collectives, Scale};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Median of `iters` runs of `f` after `warmup` runs.
fn median(
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<Duration, String> {
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// `mode` names how the ranks run (thread or process per GPU). Rank 0's
/// numbers land in the report.
pub fn run(kolo: &Kolo, report: &mut Report, mode: &str) {
    match bench(kolo, mode) {
        Ok(numbers) => {
            report.bench = numbers;
            report.check("bench", Ok(()));
        }
        Err(e) => report.check("bench", Err(e)),
    }
}

/// `count` gradients of `elems` ones on `s`, allocated with cudarc's event
/// tracking off (`untracked`: the caller orders its streams, as PyTorch's
/// users do) or on.
fn gradients(
    s: &Arc<CudaStream>,
    count: usize,
    elems: usize,
    untracked: bool,
) -> Result<Vec<CudaSlice<f32>>, String> {
    let ctx = s.context();
    let was = ctx.is_event_tracking();
    if untracked {
        // SAFETY: only the buffers allocated below lose their events; they
        // are used on `s` and by the engine, which orders its work after
        // `s` (the ready event), and tracking comes back right after.
        unsafe { ctx.disable_event_tracking() };
    }
    let grads = (0..count)
        .map(|_| upload(s, &vec![1.0f32; elems]))
        .collect::<Result<_, _>>();
    if untracked && was {
        // SAFETY: restores the setting found above.
        unsafe { ctx.enable_event_tracking() };
    }
    grads
}

/// Median time of a device allreduce of `group`'s tensors `grads`.
fn group_step(
    kolo: &Kolo,
    group: &TensorGroup,
    grads: &mut [CudaSlice<f32>],
    op: ReduceOp,
) -> Result<Duration, String> {
    median(3, 10, || {
        kolo.allreduce_group(group, grads.iter_mut(), op)
            .map_err(|e| e.to_string())
    })
}

fn bench(kolo: &Kolo, mode: &str) -> Result<Option<Numbers>, String> {
    let s = caller_stream(kolo)?;
    let elems = (16 << 10) / 4;
    let named = |prefix: &str| TensorGroup::new((0..1000).map(|t| format!("{prefix}.{t}")));
    let group = named("bench/grad").map_err(|e| e.to_string())?;
    let mut grads = gradients(&s, 1000, elems, false)?;
    let step = group_step(kolo, &group, &mut grads, ReduceOp::Average)?;
    drop(grads);
    let mut grads = gradients(&s, 1000, elems, true)?;
    let step_untracked = group_step(kolo, &group, &mut grads, ReduceOp::Average)?;
    let mut big = upload(&s, &vec![1.0f32; 1000 * elems])?;
    let single = median(3, 10, || {
        kolo.allreduce("bench/16MiB", &mut big, ReduceOp::Average)
            .map_err(|e| e.to_string())
    })?;
    // The engine's per-tensor cost: 1,000 one-element tensors, on the
    // device and on the host (negotiation, table and handles alone).
    let tiny_group = named("bench/tiny").map_err(|e| e.to_string())?;
    let mut tiny = gradients(&s, 1000, 1, false)?;
    let tiny_device = group_step(kolo, &tiny_group, &mut tiny, ReduceOp::Sum)?;
    let host_group = named("bench/host").map_err(|e| e.to_string())?;
    let mut host: Vec<Vec<f32>> = vec![vec![1.0f32]; 1000];
    let tiny_host = median(3, 10, || {
        let mut bufs: Vec<&mut [f32]> = host.iter_mut().map(Vec::as_mut_slice).collect();
        kolo.allreduce_group(&host_group, &mut bufs, ReduceOp::Sum)
            .map_err(|e| e.to_string())
    })?;
    let mut small = upload(&s, &[1.0f32; 2])?;
    let latency = median(20, 200, || {
        kolo.allreduce("bench/8B", &mut small, ReduceOp::Sum)
            .map_err(|e| e.to_string())
    })?;
    if kolo.rank() != 0 {
        return Ok(None);
    }
    let n = kolo.size();
    println!(
        "engine-step: [{n} GPU(s), {mode}] 1000 x 16 KiB device gradients of one TensorGroup through the engine {:.3} ms (allocated without event tracking: {:.3} ms); one 16 MiB allreduce through the engine {:.3} ms",
        ms(step),
        ms(step_untracked),
        ms(single)
    );
    println!(
        "engine-small: [{n} GPU(s), {mode}] 8 B device allreduce through the engine, median {:.1} us (call to completion)",
        latency.as_secs_f64() * 1e6
    );
    println!(
        "engine-overhead: [{n} GPU(s), {mode}] 1000 x 4 B TensorGroup allreduce through the engine: device {:.3} ms, host {:.3} ms",
        ms(tiny_device),
        ms(tiny_host)
    );
    let stats = kolo.stats();
    println!(
        "engine-stats: {} operations, {} tensors, {} fused, {} cache hits",
        stats.operations, stats.tensors, stats.fused_operations, stats.cache_hits
    );
    Ok(Some(Numbers {
        step,
        step_untracked,
        small: latency,
    }))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Rank 0's engine numbers, for the comparison with the backend.
#[derive(Clone, Copy, Debug)]
pub struct Numbers {
    pub step: Duration,
    pub step_untracked: Duration,
    pub small: Duration,
}

/// The same steps on kolo-nccl directly, in this process, on `n` GPUs
/// (thread per GPU): 1,000 x 16 KiB gradients (allocated without event
/// tracking) fused by one batched pack, one allreduce and one batched
/// unpack, and one 8-byte allreduce, each waited for; printed next to
/// the engine's `numbers` with the ratios.
pub fn backend(n: usize, options: NcclOptions, numbers: Numbers) -> Result<(), String> {
    let ctrls = kolo_threads::communicators(n).map_err(|e| e.to_string())?;
    let results = kolo_nccl::threads::run(ctrls, options, |comm, _ctrl| {
        backend_rank(comm).map_err(kolo_nccl::NcclError::InvalidArgument)
    })
    .map_err(|e| e.to_string())?;
    let (fused, small) = results.first().copied().ok_or("no rank ran")?;
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-12);
    println!(
        "backend-step: [{n} GPU(s)] 1000 x 16 KiB on kolo-nccl directly (one batched pack, one allreduce, one batched unpack) {:.3} ms; engine / backend: {:.2}x (untracked), {:.2}x (tracked); target <= 1.3x",
        ms(fused),
        ratio(numbers.step_untracked, fused),
        ratio(numbers.step, fused)
    );
    println!(
        "backend-small: [{n} GPU(s)] 8 B allreduce on kolo-nccl directly, median {:.1} us; engine / backend: {:.2}x; target <= 2x",
        small.as_secs_f64() * 1e6,
        ratio(numbers.small, small)
    );
    Ok(())
}

/// One rank of [`backend`]: the fused step's and the 8-byte allreduce's
/// medians.
fn backend_rank(comm: &mut NcclComm) -> Result<(Duration, Duration), String> {
    let stream = Arc::clone(comm.stream());
    let elems = (16 << 10) / 4;
    let grads = gradients(&stream, 1000, elems, true)?;
    let space = UntrackedSpace::new(Arc::clone(&stream));
    let mut views: Vec<CudaMut<'_, f32>> = Vec::with_capacity(grads.len());
    for grad in &grads {
        let (ptr, guard) = grad.device_ptr(&stream);
        drop(guard);
        // SAFETY: `grads` outlives the views and every step is waited for
        // (`synchronize`) before the next one or the end; the views are
        // disjoint buffers, used only by the communicator's stream.
        let view = unsafe { space.view_mut::<f32>(ptr, grad.len()) }.ok_or("unaligned")?;
        views.push(view);
    }
    let t = |e: kolo_transport::TransportError| e.to_string();
    let mut fused = Collectives::<Cuda>::new_buffer::<f32>(comm, 1000 * elems).map_err(t)?;
    let step = median(3, 10, || {
        let srcs: Vec<CudaRef<'_, f32>> = views.iter().map(CudaMut::freeze).collect();
        Collectives::<Cuda>::pack_into(comm, &srcs, fused.view_mut()).map_err(t)?;
        drop(srcs);
        Collectives::<Cuda>::allreduce(comm, fused.view_mut(), ReduceOp::Average, Scale::NONE)
            .map_err(t)?;
        Collectives::<Cuda>::unpack_from(comm, fused.view(), &mut views).map_err(t)?;
        Collectives::<Cuda>::synchronize(comm).map_err(t)
    })?;
    drop(views);
    let mut small = upload(&stream, &[1.0f32; 2])?;
    let latency = median(20, 200, || {
        comm.all_reduce(&mut small, ReduceOp::Sum, Scale::NONE)
            .and_then(|work| work.wait())
            .map_err(|e| e.to_string())
    })?;
    Ok((step, latency))
}
