//! kolo-pipeline over NCCL on real GPUs: every channel a two-rank NCCL
//! communicator (`kolo_pipeline::nccl::nccl_channels`), ranks as threads of
//! this process (kolo-nccl's thread mode), rank r on GPU r % GPUs, host
//! tensors moved GPU to GPU through kolo-nccl's `HostStaging`.
//!
//! Widths 1, 1 and 1, 2, 1: training runs of 12 and 7 minibatches, a
//! forward-only run with acks, tensors of 8 to 24 MiB, and (1, 2, 1) a
//! failing stage whose neighbours must fail naming it. Then device tensors
//! (`send_device` / `recv_device`) on widths 1, 1: f32 and i32 GPU to GPU
//! forward and back, shapes that change per minibatch, one of 8 MiB
//! (`gpu_device`). One `PASS` or `FAIL` line per check; widths with more
//! ranks than GPUs are attempted and, when `nccl_channels` (which checks
//! before NCCL does) refuses two ranks of a channel on one GPU, reported
//! as `SKIP` with the refusal. Every check runs under a watchdog: one that
//! hangs is a `FAIL` and ends the binary.
//! Without a GPU (or NCCL) it prints `skipped: ...` and exits 0.
//!
//! Build: `cargo test --release -p kolo-pipeline --features nccl --test
//! gpu_nccl --no-run`; run the printed executable (or `cargo test
//! --release -p kolo-pipeline --features nccl --test gpu_nccl`). It sets
//! `NCCL_NVLS_ENABLE=0` unless the environment says otherwise. An argument
//! runs only the checks whose name contains it (`gpu_nccl device`: the
//! device-tensor check alone).

mod common;
mod gpu_checks;
mod gpu_device;

use common::{finish_or_abort, run_stage, run_stage_wide, spec_for, totals, Report, TestError};
use gpu_checks::{bounded, print, Outcome};
use kolo_nccl::{Device, NcclOptions};
use kolo_pipeline::nccl::{nccl_channels, NcclChannel};
use kolo_pipeline::{ChannelSet, Direction, Options, Pipeline, PipelineSpec, StagePlan};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The bound on one check, channel set-up included.
const CHECK_TIMEOUT: Duration = Duration::from_secs(240);

/// NCCL operations pending longer fail (a lost peer must not hang).
const OP_TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    gpu_checks::nvls_off();
    let gpus = match kolo_nccl::probe::platform() {
        Ok(p) => {
            println!(
                "{} GPU(s), NCCL {} from {}",
                p.devices,
                kolo_nccl::probe::version_string(p.nccl_version),
                p.nccl_library
            );
            p.devices
        }
        Err(e) => {
            println!("skipped: no CUDA device or NCCL ({e})");
            return ExitCode::SUCCESS;
        }
    };
    if gpus < 2 {
        println!("skipped: NCCL channels need 2 GPUs, {gpus} visible");
        return ExitCode::SUCCESS;
    }
    let runs = [
        ("training_12", Options::training(12), 4),
        ("training_7", Options::training(7), 4),
        ("forward_only_9_window_2", Options::forward_only(9, 2), 4),
        ("training_4_8_to_24_MiB", Options::training(4), 2 << 20),
    ];
    let mut failed = 0;
    for widths in [&[1usize, 1][..], &[1, 2, 1]] {
        let mut checks: Vec<(String, Box<dyn FnOnce() -> Outcome + Send>)> = runs
            .iter()
            .map(|&(label, options, cols)| {
                let check: Box<dyn FnOnce() -> Outcome + Send> =
                    Box::new(move || stage_run(widths, gpus, options, cols));
                (label.to_string(), check)
            })
            .collect();
        if widths == [1, 2, 1] {
            checks.push((
                "failing_stage_is_named".into(),
                Box::new(move || failing_stage(gpus)),
            ));
        }
        for (label, check) in checks {
            let name = format!("nccl widths {widths:?} {label}");
            match run_check(&name, check) {
                Outcome::Skip(_) => break, // The same refusal for every run of these widths.
                Outcome::Fail(_) => failed += 1,
                Outcome::Pass(_) => {}
            }
        }
    }
    let device = run_check(
        "nccl widths [1, 1] device_tensors_f32_i32_up_to_8_MiB",
        Box::new(move || device_run(gpus)),
    );
    if let Outcome::Fail(_) = device {
        failed += 1;
    }
    if failed > 0 {
        println!("gpu_nccl: {failed} check(s) FAILED");
        return ExitCode::FAILURE;
    }
    println!("gpu_nccl: all checks passed");
    ExitCode::SUCCESS
}

/// Runs `check` under the watchdog and prints its `PASS` / `SKIP` /
/// `FAIL` line; returns its outcome.
fn run_check(name: &str, check: Box<dyn FnOnce() -> Outcome + Send>) -> Outcome {
    if let Some(filter) = std::env::args().nth(1) {
        if !name.contains(&filter) {
            return Outcome::Pass(String::new());
        }
    }
    let started = Instant::now();
    let outcome = bounded(name, CHECK_TIMEOUT, check);
    print(name, &outcome, started);
    outcome
}

/// Device tensors forward and back on widths (1, 1), rank r on GPU r %
/// GPUs (see `gpu_device`).
fn device_run(gpus: usize) -> Outcome {
    // The upload streams are opened before any channel exists (see
    // `gpu_device::device_stage`).
    let mut devices = Vec::new();
    for gpu in 0..2 {
        match Device::open(gpu % gpus) {
            Ok(device) => devices.push(device),
            Err(e) => return Outcome::Fail(format!("opening GPU {gpu}: {e}")),
        }
    }
    let spec = gpu_device::device_spec();
    let options = Options::training(gpu_device::MINIBATCHES);
    let results = match run_ranks(&spec, options, gpus, |pipe| {
        let rank = pipe.plan().rank();
        let device = devices
            .get(rank)
            .ok_or_else(|| TestError(format!("no device opened for rank {rank}")))?;
        gpu_device::device_stage(pipe, device)
    }) {
        Ok(results) => results,
        Err(outcome) => return outcome,
    };
    let mut bytes = 0;
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Ok(received) => bytes += received,
            Err(why) => return Outcome::Fail(format!("rank {rank}: {why}")),
        }
    }
    Outcome::Pass(gpu_device::device_note(bytes))
}

/// The channels of `spec` over NCCL, rank r on GPU r % gpus; a refusal of
/// two ranks on one GPU is a skip, any other error a failure.
fn channels(
    spec: &PipelineSpec,
    options: &Options,
    gpus: usize,
) -> Result<Vec<Mutex<Option<ChannelSet<NcclChannel>>>>, Outcome> {
    let nccl = NcclOptions {
        op_timeout: OP_TIMEOUT,
        teardown_timeout: Duration::from_secs(20),
        ..NcclOptions::default()
    };
    match nccl_channels(spec, options, &nccl, |rank| rank % gpus) {
        Ok(sets) => Ok(sets.into_iter().map(|s| Mutex::new(Some(s))).collect()),
        Err(e) => {
            let text = e.to_string();
            let shared = spec.world_size > gpus;
            let refused = ["both use device", "invalid usage", "Duplicate GPU"]
                .iter()
                .any(|m| text.contains(m));
            Err(if shared && refused {
                Outcome::Skip(format!(
                    "{} ranks on {gpus} GPUs put both ends of a channel on one GPU, \
                     which NCCL refuses: {text}",
                    spec.world_size
                ))
            } else {
                Outcome::Fail(format!("creating the channels: {text}"))
            })
        }
    }
}

/// Runs `f` on every rank (a thread each) over NCCL channels: finished on
/// `Ok`, aborted with the error otherwise. Returns every rank's result.
pub fn run_ranks<R: Send>(
    spec: &PipelineSpec,
    options: Options,
    gpus: usize,
    f: impl Fn(&Pipeline) -> Result<R, TestError> + Sync,
) -> Result<Vec<Result<R, String>>, Outcome> {
    let sets = channels(spec, &options, gpus)?;
    let results: Vec<Result<R, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..spec.world_size)
            .map(|rank| {
                let (sets, f) = (&sets, &f);
                s.spawn(move || -> Result<R, TestError> {
                    let set = sets[rank]
                        .lock()
                        .map_err(|_| TestError("poisoned".into()))?
                        .take()
                        .ok_or_else(|| TestError(format!("rank {rank}'s channels are gone")))?;
                    let pipe = Pipeline::start(StagePlan::new(spec, rank)?, options, set)?;
                    finish_or_abort(pipe, f)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(result) => result.map_err(|e| e.0),
                Err(_) => Err("the rank panicked".into()),
            })
            .collect()
    });
    Ok(results)
}

/// Every rank runs its stage (1F1B, or forward only), checking every tensor
/// it receives; the pipeline's message totals must add up.
fn stage_run(widths: &'static [usize], gpus: usize, options: Options, cols: usize) -> Outcome {
    let spec = spec_for(widths);
    let results = match run_ranks(&spec, options, gpus, |pipe| run_stage_wide(pipe, &(), cols)) {
        Ok(results) => results,
        Err(outcome) => return outcome,
    };
    let mut reports: Vec<Report> = Vec::new();
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Ok(report) => reports.push(report),
            Err(why) => return Outcome::Fail(format!("rank {rank}: {why}")),
        }
    }
    let forward: u64 = reports.iter().map(|r| r.received_forward).sum();
    let backward: u64 = reports.iter().map(|r| r.received_backward).sum();
    let want = totals(widths, options.iterations, options.is_forward_only());
    if (forward, backward) != want {
        return Outcome::Fail(format!(
            "received {forward} forward and {backward} backward messages, expected {want:?}"
        ));
    }
    Outcome::Pass(format!(": {forward} forward, {backward} backward messages"))
}

/// Widths 1, 2, 1: rank 2 gives up after its first minibatch; ranks 0 and
/// 3, its neighbours, must fail naming it.
fn failing_stage(gpus: usize) -> Outcome {
    let spec = spec_for(&[1, 2, 1]);
    let results = match run_ranks(&spec, Options::training(12), gpus, |pipe| {
        if pipe.plan().rank() == 2 {
            pipe.recv("h1", 1, Direction::Forward)?;
            return Err(TestError("injected failure on rank 2".into()));
        }
        run_stage(pipe, &())
    }) {
        Ok(results) => results,
        Err(outcome) => return outcome,
    };
    for (rank, expected) in [
        (0, "rank 2 (stage 1) failed"),
        (2, "injected failure on rank 2"),
        (3, "rank 2 (stage 1) failed"),
    ] {
        match &results[rank] {
            Err(why) if why.contains(expected) => {}
            Err(why) => {
                return Outcome::Fail(format!(
                    "rank {rank}: expected an error containing '{expected}', got: {why}"
                ))
            }
            Ok(_) => return Outcome::Fail(format!("rank {rank} succeeded")),
        }
    }
    Outcome::Pass(String::new())
}
