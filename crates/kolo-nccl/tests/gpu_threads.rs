//! Thread mode on real GPUs: one thread per GPU in this process, for 1 and
//! 2 GPUs (or `--gpus N`, repeatable). Every device operation, transactions,
//! copy engines and the conformance suite through `HostStaging`. With
//! `--peer` instead: the peer allreduce kernels on simulated ranks and
//! threads of GPU 0; `--peer-bench`: their one-GPU timings; `--peer-trap`:
//! a kernel whose peer never comes fails instead of spinning (`run.sh`
//! runs all three). Without a
//! GPU it prints `skipped: no CUDA device (reason)` and exits 0. The
//! timings are the `nccl_bench` benchmark's.

mod gpu;
// Only this binary runs the simulated ranks (one GPU is enough).
#[path = "gpu/peer_allreduce.rs"]
mod peer_allreduce;
#[path = "gpu/peer_group.rs"]
mod peer_group;

use gpu::{transactions, watchdog, Report, OP_TIMEOUT, TEARDOWN_TIMEOUT};
use kolo_nccl::{CopyEngine, NcclComm, NcclOptions};
use kolo_transport::Topology;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gpus = match gpu::gpus_or_skip() {
        Ok(gpus) => gpus,
        Err(why) => {
            println!("skipped: no CUDA device ({why})");
            return;
        }
    };
    if args.iter().any(|a| a == "--peer-trap") {
        // Breaks the context: its own invocation.
        let outcome = kolo_nccl::Device::open(0)
            .map_err(|e| e.to_string())
            .and_then(|d| peer_allreduce::dead_peer_traps(d.context()));
        match outcome {
            Ok(()) => println!("gpu_threads: all checks passed"),
            Err(e) => {
                println!("FAIL a dead peer: {e}");
                println!("gpu_threads: FAILED");
                std::process::exit(1);
            }
        }
        return;
    }
    let peer = args.iter().any(|a| a == "--peer");
    let bench = args.iter().any(|a| a == "--peer-bench");
    if peer || bench {
        let ok = run_peer(peer, bench);
        if !ok {
            println!("gpu_threads: FAILED");
            std::process::exit(1);
        }
        println!("gpu_threads: all checks passed");
        return;
    }
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
            println!("skipped: thread mode on {n} GPUs needs {n}, {gpus} visible");
            continue;
        }
        ok &= run_threads(n);
    }
    if !ok {
        println!("gpu_threads: FAILED");
        std::process::exit(1);
    }
    println!("gpu_threads: all checks passed");
}

/// The peer allreduce kernels on simulated ranks of GPU 0 (see
/// `gpu/peer_allreduce.rs`): their checks with `check`, their one-GPU
/// timings with `bench`.
fn run_peer(check: bool, bench: bool) -> bool {
    println!("== peer allreduce kernels, simulated ranks on GPU 0 ==");
    let device = match kolo_nccl::Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("FAIL peer allreduce: open GPU 0: {e}");
            return false;
        }
    };
    let mut report = Report::new(0);
    if check {
        peer_allreduce::run(device.context(), &mut report);
        // Registration as thread mode does it: threads of this process.
        for ranks in [2, 4] {
            let outcome = kolo_threads::communicators(ranks)
                .map_err(|e| e.to_string())
                .map(|ctrls| {
                    std::thread::scope(|s| {
                        let handles: Vec<_> = ctrls
                            .into_iter()
                            .map(|mut ctrl| {
                                s.spawn(move || {
                                    let mut r = Report::new(ctrl.rank());
                                    peer_group::run(
                                        &mut ctrl,
                                        kolo_nccl::Mode::ThreadPerGpu,
                                        &mut r,
                                    );
                                    r
                                })
                            })
                            .collect();
                        handles
                            .into_iter()
                            .map(|h| h.join().map_err(|_| "a rank panicked".to_string()))
                            .collect::<Result<Vec<Report>, String>>()
                    })
                });
            let outcome = outcome.and_then(|r| r).and_then(|reports| {
                match reports.iter().find(|r| !r.ok()) {
                    Some(r) => Err(r.failed.join("; ")),
                    None => Ok(()),
                }
            });
            report.check(&format!("peer group of {ranks} threads"), outcome);
        }
    }
    if bench {
        if let Err(e) = peer_allreduce::bench(device.context()) {
            report.check("peer allreduce timings", Err(e));
        }
    }
    println!(
        "peer allreduce: {} passed, {} failed",
        report.passed,
        report.failed.len()
    );
    report.ok()
}

fn run_threads(n: usize) -> bool {
    println!("== thread mode, {n} GPU(s) ==");
    let options = NcclOptions {
        op_timeout: OP_TIMEOUT,
        teardown_timeout: TEARDOWN_TIMEOUT,
        ..NcclOptions::default()
    };
    let ctrls = match kolo_threads::communicators(n) {
        Ok(ctrls) => ctrls,
        Err(e) => {
            println!("FAIL thread mode on {n} GPUs: {e}");
            return false;
        }
    };
    let results = kolo_nccl::threads::run(ctrls, options.clone(), |comm, ctrl| {
        let mut report = Report::new(comm.rank());
        gpu::run_all(comm, ctrl, &mut report);
        let copy = NcclOptions {
            copy_engine: CopyEngine::On,
            device: Some(comm.device().ordinal()),
            ..options.clone()
        };
        match NcclComm::init(ctrl, copy) {
            Ok(mut ce) => {
                transactions::copy_engines(&mut ce, &mut report);
                gpu::close(ce, &mut report);
            }
            Err(e) => report.check("copy engines: init", Err(e.to_string())),
        }
        watchdog::run(ctrl, comm.device().ordinal(), &mut report);
        Ok(report)
    });
    match results {
        Ok(reports) => {
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
            reports.iter().all(Report::ok)
        }
        Err(e) => {
            println!("FAIL thread mode on {n} GPUs: {e}");
            false
        }
    }
}
