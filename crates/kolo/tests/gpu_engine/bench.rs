//! `--bench`: the fused step of 1,000 x 16 KiB device gradients through
//! the engine vs one 16 MiB allreduce through it, and the 8-byte
//! allreduce latency through the engine. Rank 0 prints.

use crate::checks::{caller_stream, upload};
use crate::Report;
use kolo::nccl::cudarc::driver::{CudaSlice, CudaStream};
use kolo::{Kolo, ReduceOp};
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

/// `mode` names how the ranks run (thread or process per GPU).
pub fn run(kolo: &Kolo, report: &mut Report, mode: &str) {
    report.check("bench", bench(kolo, mode));
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

/// Median time of a grouped device allreduce of `grads` named `names`.
fn grouped_step(
    kolo: &Kolo,
    names: &[String],
    grads: &mut [CudaSlice<f32>],
    op: ReduceOp,
) -> Result<Duration, String> {
    median(3, 10, || {
        let mut group: Vec<(&str, &mut CudaSlice<f32>)> = names
            .iter()
            .map(String::as_str)
            .zip(grads.iter_mut())
            .collect();
        kolo.grouped_allreduce_device(&mut group, op)
            .map_err(|e| e.to_string())
    })
}

fn bench(kolo: &Kolo, mode: &str) -> Result<(), String> {
    let s = caller_stream(kolo)?;
    let elems = (16 << 10) / 4;
    let names: Vec<String> = (0..1000).map(|t| format!("bench/grad.{t}")).collect();
    let mut grads = gradients(&s, 1000, elems, false)?;
    let step = grouped_step(kolo, &names, &mut grads, ReduceOp::Average)?;
    drop(grads);
    let mut grads = gradients(&s, 1000, elems, true)?;
    let step_untracked = grouped_step(kolo, &names, &mut grads, ReduceOp::Average)?;
    let mut big = upload(&s, &vec![1.0f32; 1000 * elems])?;
    let single = median(3, 10, || {
        kolo.allreduce_device("bench/16MiB", &mut big, ReduceOp::Average)
            .map_err(|e| e.to_string())
    })?;
    // The engine's per-tensor cost: 1,000 one-element tensors, on the
    // device and on the host (negotiation, table and handles alone).
    let mut tiny = gradients(&s, 1000, 1, false)?;
    let tiny_device = grouped_step(kolo, &names, &mut tiny, ReduceOp::Sum)?;
    let mut host: Vec<Vec<f32>> = vec![vec![1.0f32]; 1000];
    let host_names: Vec<String> = (0..1000).map(|t| format!("bench/host.{t}")).collect();
    let tiny_host = median(3, 10, || {
        let mut group: Vec<(&str, &mut [f32])> = host_names
            .iter()
            .map(String::as_str)
            .zip(host.iter_mut().map(Vec::as_mut_slice))
            .collect();
        kolo.grouped_allreduce(&mut group, ReduceOp::Sum)
            .map_err(|e| e.to_string())
    })?;
    let mut small = upload(&s, &[1.0f32; 2])?;
    let latency = median(20, 200, || {
        kolo.allreduce_device("bench/8B", &mut small, ReduceOp::Sum)
            .map_err(|e| e.to_string())
    })?;
    if kolo.rank() == 0 {
        let n = kolo.size();
        println!(
            "engine-step: [{n} GPU(s), {mode}] 1000 x 16 KiB device gradients fused through the engine {:.3} ms (allocated without event tracking: {:.3} ms); one 16 MiB allreduce through the engine {:.3} ms",
            step.as_secs_f64() * 1e3,
            step_untracked.as_secs_f64() * 1e3,
            single.as_secs_f64() * 1e3
        );
        println!(
            "engine-small: [{n} GPU(s), {mode}] 8 B device allreduce through the engine, median {:.1} us (call to completion)",
            latency.as_secs_f64() * 1e6
        );
        println!(
            "engine-overhead: [{n} GPU(s), {mode}] 1000 x 4 B grouped allreduce through the engine: device {:.3} ms, host {:.3} ms",
            tiny_device.as_secs_f64() * 1e3,
            tiny_host.as_secs_f64() * 1e3
        );
        let stats = kolo.stats();
        println!(
            "engine-stats: {} operations, {} tensors, {} fused, {} cache hits",
            stats.operations, stats.tensors, stats.fused_operations, stats.cache_hits
        );
    }
    Ok(())
}
