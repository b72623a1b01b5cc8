//! The GPU engine on real GPUs: `kolo::nccl::run` on 1 and 2 GPUs (or
//! `--gpus N`, repeatable), every device op x {f32, f16, bf16, i32}
//! against a host reference, fusion of 100 device tensors in one
//! operation, mismatch errors (shape, dtype, CPU/GPU mix), host tensors on
//! the same engine, and the timeline. One `ok` / `FAIL` line per check;
//! every wait is bounded by the communicators' operation timeout. Without
//! a GPU it prints `skipped: ...` and exits 0.
//!
//! `--bench` also prints `engine-step:` (1,000 x 16 KiB device gradients
//! of one TensorGroup through the engine vs one 16 MiB allreduce) and
//! `engine-small:` (8-byte allreduce latency through the engine), and, in
//! thread mode, `backend-step:` / `backend-small:`: the same on kolo-nccl
//! directly in the same run, with the engine / backend ratios. With `--bench` the
//! engine writes no timeline (rank 0 would record every tensor's events
//! inside the timed steps); the runs without it check the timeline.
//!
//! Built with the `mpi` feature too and started under `mpirun` (one
//! process per GPU), it runs the same checks on `Kolo::init_nccl_mpi`
//! instead: `mpirun -np 2 gpu_engine [--bench]`; built with `ucx` and
//! started by kolo-run (or torchrun's variables), on `Kolo::init_nccl_ucx`,
//! NCCL bootstrapped through the rendezvous store: `kolo-run -n 2
//! gpu_engine`. There, `--killed` kills a rank mid-allreduce instead
//! (see `killed.rs`).

mod bench;
mod checks;
#[cfg(feature = "ucx")]
mod killed;
mod suite;

use kolo::nccl::NcclOptions;
use kolo::{Config, Kolo};
use std::time::Duration;

/// Passed and failed checks of one rank.
#[derive(Debug, Default)]
pub struct Report {
    pub rank: usize,
    pub passed: usize,
    pub failed: Vec<String>,
    /// Rank 0's `--bench` numbers.
    pub bench: Option<bench::Numbers>,
}

impl Report {
    /// Records one check and prints its line.
    pub fn check(&mut self, name: &str, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                self.passed += 1;
                println!("rank {}: ok   {name}", self.rank);
            }
            Err(why) => {
                println!("rank {}: FAIL {name}: {why}", self.rank);
                self.failed.push(format!("{name}: {why}"));
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    #[cfg(feature = "mpi")]
    if kolo_mpi::launcher::under_mpirun() {
        let ok = run_process("Kolo::init_nccl_mpi", Kolo::init_nccl_mpi_with, bench);
        std::process::exit(i32::from(!ok));
    }
    #[cfg(feature = "ucx")]
    if std::env::var_os("MASTER_ADDR").is_some() && std::env::var_os("RANK").is_some() {
        if args.iter().any(|a| a == "--killed") {
            let outcome = killed::run(Kolo::init_nccl_ucx_with);
            if let Err(why) = &outcome {
                println!("FAIL --killed: {why}");
            }
            std::process::exit(i32::from(outcome.is_err()));
        }
        let ok = run_process("Kolo::init_nccl_ucx", Kolo::init_nccl_ucx_with, bench);
        std::process::exit(i32::from(!ok));
    }
    let gpus = match kolo_nccl::probe::platform() {
        Ok(p) if p.devices > 0 => p.devices,
        Ok(_) => {
            println!("skipped: no CUDA device visible");
            return;
        }
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let mut wanted: Vec<usize> = args
        .windows(2)
        .filter(|w| w[0] == "--gpus")
        .filter_map(|w| w[1].parse().ok())
        .collect();
    if wanted.is_empty() {
        wanted = vec![1, 2];
    }
    let mut ok = true;
    for n in wanted {
        if n > gpus {
            println!("skipped: the engine on {n} GPUs needs {n}, {gpus} visible");
            continue;
        }
        ok &= run_engine(n, bench);
        if !bench {
            ok &= suite::run(n, options());
        }
    }
    if !ok {
        println!("gpu_engine: FAILED");
        std::process::exit(1);
    }
    println!("gpu_engine: all checks passed");
}

/// The communicators' bounds: a hang fails a check, it does not stall
/// the run.
fn options() -> NcclOptions {
    NcclOptions {
        op_timeout: Duration::from_secs(60),
        teardown_timeout: Duration::from_secs(30),
        ..NcclOptions::default()
    }
}

/// The checks (and the bench) of one rank.
fn rank_checks(kolo: &Kolo, bench: bool, mode: &str) -> Report {
    let mut report = Report {
        rank: kolo.rank(),
        ..Report::default()
    };
    checks::run_all(kolo, &mut report);
    if bench {
        bench::run(kolo, &mut report, mode);
    }
    report
}

/// A temporary directory for the timeline, or why not.
fn timeline_dir() -> Option<tempfile::TempDir> {
    match tempfile::tempdir() {
        Ok(dir) => Some(dir),
        Err(e) => {
            println!("FAIL temporary directory: {e}");
            None
        }
    }
}

/// This process's rank of a job of one process per GPU, started by
/// `init` (`Kolo::init_nccl_mpi` under mpirun, `Kolo::init_nccl_ucx` under
/// kolo-run): every check on the GPU of its local rank, then the timeline
/// on rank 0 once the engine has stopped.
#[cfg(any(feature = "mpi", feature = "ucx"))]
fn run_process(
    how: &str,
    init: impl FnOnce(Config, NcclOptions) -> Result<Kolo, kolo::Error>,
    bench: bool,
) -> bool {
    let Some(dir) = timeline_dir() else {
        return false;
    };
    let timeline = dir.path().join("timeline.json");
    let config = engine_config(&timeline, bench);
    let kolo = match init(config, options()) {
        Ok(kolo) => kolo,
        Err(e) => {
            println!("FAIL {how}: {e}");
            return false;
        }
    };
    if kolo.rank() == 0 {
        println!("== GPU engine by {how}, {} process(es) ==", kolo.size());
    }
    let mut report = rank_checks(&kolo, bench, "process per GPU");
    let rank = report.rank;
    if let Err(e) = kolo.shutdown() {
        report.check("shutdown", Err(e.to_string()));
    }
    drop(kolo);
    if rank == 0 && !bench {
        report.check("timeline", checks::timeline(&timeline));
    }
    println!(
        "rank {rank}: {} passed, {} failed",
        report.passed,
        report.failed.len()
    );
    report.failed.is_empty()
}

/// Every check on `n` GPUs, one engine per GPU.
fn run_engine(n: usize, bench: bool) -> bool {
    println!("== GPU engine, {n} GPU(s) ==");
    let Some(dir) = timeline_dir() else {
        return false;
    };
    let timeline = dir.path().join("timeline.json");
    let config = engine_config(&timeline, bench);
    let results = kolo::nccl::run_with(n, config, options(), |kolo: &Kolo| {
        Ok(rank_checks(kolo, bench, "thread per GPU"))
    });
    let mut baseline = Report::default();
    let mut ok = match results {
        Ok(reports) => {
            if let Some(numbers) = reports.iter().find_map(|r| r.bench) {
                baseline.check("backend baseline", bench::backend(n, options(), numbers));
            }
            for r in &reports {
                println!(
                    "rank {}: {} passed, {} failed",
                    r.rank,
                    r.passed,
                    r.failed.len()
                );
                for f in &r.failed {
                    println!("rank {}:   {f}", r.rank);
                }
            }
            reports.iter().all(|r| r.failed.is_empty())
        }
        Err(e) => {
            println!("FAIL the engine on {n} GPUs: {e}");
            false
        }
    };
    ok &= baseline.failed.is_empty();
    if !bench {
        let mut report = Report::default();
        report.check("timeline", checks::timeline(&timeline));
        ok &= report.failed.is_empty();
    }
    ok
}

/// The engine's settings: with a timeline at `timeline` for the checks;
/// without one for `--bench`, whose numbers would otherwise include rank
/// 0 writing every tensor's events (the timeline is checked by the runs
/// without `--bench`).
fn engine_config(timeline: &std::path::Path, bench: bool) -> Config {
    if bench {
        Config::default()
    } else {
        Config::default().timeline(timeline)
    }
}
