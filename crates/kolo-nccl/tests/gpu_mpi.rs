//! Process mode on real GPUs: one process per GPU under `mpirun`, the NCCL
//! id broadcast over MPI. Run directly it re-runs itself under `mpirun`
//! with 1 and 2 processes (or `--np N`, repeatable) when enough GPUs are
//! visible; under `mpirun` it is one rank. `--peer-np N` instead runs N
//! processes on GPU 0 that register peer-allreduce buffers through CUDA
//! IPC and run the kernels across them. Without a GPU it prints
//! `skipped: no CUDA device (reason)` and exits 0. The timings are the
//! `nccl_bench` benchmark's.

mod gpu;
// Only this binary registers peer buffers across processes.
#[path = "gpu/peer_group.rs"]
mod peer_group;

use gpu::{watchdog, Report, OP_TIMEOUT, TEARDOWN_TIMEOUT};
use kolo_mpi::launcher::{mpirun_self, under_mpirun};
use kolo_mpi::MpiComm;
use kolo_nccl::{NcclComm, NcclOptions};
use kolo_transport::{Controller, Topology};
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if under_mpirun() {
        std::process::exit(rank_main());
    }
    let gpus = match gpu::gpus_or_skip() {
        Ok(gpus) => gpus,
        Err(why) => {
            println!("skipped: no CUDA device ({why})");
            return;
        }
    };
    // `--peer-np N`: N processes on GPU 0 register their buffers through
    // CUDA IPC and run the peer allreduce kernels across them.
    let peer: Vec<usize> = args
        .windows(2)
        .filter(|w| w[0] == "--peer-np")
        .filter_map(|w| w[1].parse().ok())
        .collect();
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
    let runs: Vec<(usize, Vec<&str>)> = if peer.is_empty() {
        wanted.into_iter().map(|np| (np, Vec::new())).collect()
    } else {
        peer.into_iter().map(|np| (np, vec!["--peer"])).collect()
    };
    for (np, rank_args) in runs {
        let peer_run = !rank_args.is_empty();
        if np > gpus && !peer_run {
            println!("skipped: {np} processes need {np} GPUs, {gpus} visible");
            continue;
        }
        println!(
            "== process mode: mpirun -np {np} {} ==",
            rank_args.join(" ")
        );
        match mpirun_self(
            &exe,
            np,
            rank_args,
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
fn rank_main() -> i32 {
    let mut mpi = match MpiComm::init(false) {
        Ok(mpi) => mpi,
        Err(e) => {
            println!("FAIL: MPI init: {e}");
            return 1;
        }
    };
    let rank = mpi.rank();
    let mut report = Report::new(rank);
    if std::env::args().any(|a| a == "--peer") {
        peer_group::run(&mut mpi, kolo_nccl::Mode::ProcessPerGpu, &mut report);
        return verdict(&mut mpi, &report);
    }
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
            gpu::run_all(&mut comm, &mut mpi, &mut report);
            let ordinal = comm.device().ordinal();
            gpu::close(comm, &mut report);
            watchdog::run(&mut mpi, ordinal, &mut report);
        }
        Err(e) => report.check("NcclComm::init over MPI", Err(e.to_string())),
    }
    verdict(&mut mpi, &report)
}

/// Prints this rank's counts; 0 when every rank passed.
fn verdict(mpi: &mut MpiComm, report: &Report) -> i32 {
    println!(
        "rank {}: {} passed, {} failed",
        report.rank,
        report.passed,
        report.failed.len()
    );
    let verdicts = mpi
        .allgather_bytes(&[u8::from(report.ok())])
        .unwrap_or_default();
    i32::from(!(verdicts.len() == mpi.size() && verdicts.iter().all(|v| v.as_slice() == [1])))
}
