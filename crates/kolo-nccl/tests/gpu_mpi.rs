//! Process mode on real GPUs: one process per GPU under `mpirun`, the NCCL
//! id broadcast over MPI. Run directly it re-runs itself under `mpirun`
//! with 1 and 2 processes (or `--np N`, repeatable) when enough GPUs are
//! visible; under `mpirun` it is one rank. Without a GPU it prints
//! `skipped: no CUDA device (reason)` and exits 0.
//!
//! `--bench` also prints nccl-tests-style bandwidths, the small-allreduce
//! breakdown and the fused step (plus `json:` lines); `--no-checks` skips
//! the checks (bench only); `--small` prints the bench without the
//! bandwidth tables.

mod gpu;

use gpu::{print_bench, Report, OP_TIMEOUT, TEARDOWN_TIMEOUT};
use kolo_mpi::launcher::{mpirun_self, under_mpirun};
use kolo_mpi::MpiComm;
use kolo_nccl::{NcclComm, NcclOptions};
use kolo_transport::{Controller, Topology};
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let small = args.iter().any(|a| a == "--small");
    // Some(whether to print the bandwidth tables).
    let bench = (small || args.iter().any(|a| a == "--bench")).then_some(!small);
    let checks = !args.iter().any(|a| a == "--no-checks");
    if under_mpirun() {
        std::process::exit(rank_main(bench, checks));
    }
    let gpus = match gpu::gpus_or_skip() {
        Ok(gpus) => gpus,
        Err(why) => {
            println!("skipped: no CUDA device ({why})");
            return;
        }
    };
    let mut wanted: Vec<usize> = args
        .windows(2)
        .filter(|w| w[0] == "--np")
        .filter_map(|w| w[1].parse().ok())
        .collect();
    if wanted.is_empty() {
        wanted = vec![1, 2];
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            println!("FAIL: cannot find this executable: {e}");
            std::process::exit(1);
        }
    };
    let mut ok = true;
    for np in wanted {
        if np > gpus {
            println!("skipped: {np} processes need {np} GPUs, {gpus} visible");
            continue;
        }
        println!("== process mode: mpirun -np {np} ==");
        let mut pass: Vec<&str> = match bench {
            Some(true) => vec!["--bench"],
            Some(false) => vec!["--small"],
            None => vec![],
        };
        if !checks {
            pass.push("--no-checks");
        }
        match mpirun_self(
            &exe,
            np,
            pass,
            &[("NCCL_NVLS_ENABLE", "0")],
            Duration::from_secs(1200),
        ) {
            Ok(out) => {
                print!("{}", String::from_utf8_lossy(&out.stdout));
                eprint!("{}", String::from_utf8_lossy(&out.stderr));
                if !out.status.success() {
                    println!("FAIL: mpirun -np {np} exited with {}", out.status);
                    ok = false;
                }
            }
            Err(e) => {
                println!("FAIL: mpirun -np {np}: {e}");
                ok = false;
            }
        }
    }
    if !ok {
        println!("gpu_mpi: FAILED");
        std::process::exit(1);
    }
    println!("gpu_mpi: all checks passed");
}

/// One rank: build the communicator over MPI, run every check, agree on
/// the outcome with the other ranks.
fn rank_main(bench: Option<bool>, checks: bool) -> i32 {
    let mut mpi = match MpiComm::init(false) {
        Ok(mpi) => mpi,
        Err(e) => {
            println!("FAIL: MPI init: {e}");
            return 1;
        }
    };
    let rank = mpi.rank();
    let mut report = Report::new(rank);
    let options = NcclOptions {
        op_timeout: OP_TIMEOUT,
        teardown_timeout: TEARDOWN_TIMEOUT,
        ..NcclOptions::default()
    };
    match NcclComm::init(&mut mpi, options) {
        Ok(mut comm) => {
            report.check(
                "process mode",
                if comm.mode() == kolo_nccl::Mode::ProcessPerGpu {
                    Ok(())
                } else {
                    Err(format!("{:?}", comm.mode()))
                },
            );
            if checks {
                gpu::run_all(&mut comm, &mut mpi, &mut report);
            }
            if let Some(tables) = bench {
                print_bench(&mut comm, "process mode", tables);
            }
            gpu::close(comm, &mut report);
        }
        Err(e) => report.check("NcclComm::init over MPI", Err(e.to_string())),
    }
    println!(
        "rank {rank}: {} passed, {} failed",
        report.passed,
        report.failed.len()
    );
    let verdicts = mpi
        .allgather_bytes(&[u8::from(report.ok())])
        .unwrap_or_default();
    i32::from(!(verdicts.len() == mpi.size() && verdicts.iter().all(|v| v.as_slice() == [1])))
}
