//! kolo-nccl's timings on real GPUs: nccl-tests-style bandwidth tables
//! (8 B to 1 GiB, every operation), the small-allreduce latency and where
//! its time goes (against bare `ncclAllReduce` calls), and a step of 1,000
//! small gradients fused in a `DeviceFusionBuffer` against one allreduce
//! of the same bytes. Rank 0 prints each row, also as a `json:` line.
//!
//! ```text
//! cargo bench -p kolo-nccl --bench nccl_bench -- --gpus 2      # thread mode, 2 GPUs
//! mpirun -np 2 target/release/deps/nccl_bench-* --bench        # process mode
//! ./nccl_bench --bench --gpus 1 --gpus 2 --small               # from gpu-dist/
//! ```
//!
//! Thread mode (one process, a thread per GPU) runs once per `--gpus N`
//! (default 1 and 2), with copy engines and without; under `mpirun` each
//! process is one rank (process mode). `--small` leaves out the bandwidth
//! tables. Without `--bench` (as `cargo test` runs bench targets) only the
//! pure helpers are checked; without a GPU it prints
//! `skipped: no CUDA device (reason)` and exits 0.

mod latency;
mod ops;
mod report;

use kolo_mpi::launcher::under_mpirun;
use kolo_mpi::MpiComm;
use kolo_nccl::{CopyEngine, NcclComm, NcclOptions};
use std::time::Duration;

/// The bound on every GPU operation: a hang fails, it does not stall the run.
const OP_TIMEOUT: Duration = Duration::from_secs(120);
/// Ranks may reach teardown seconds apart.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(60);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        match ops::self_check() {
            Ok(()) => println!("nccl_bench: helpers checked (pass --bench to measure)"),
            Err(what) => {
                println!("nccl_bench: FAIL {what}");
                std::process::exit(1);
            }
        }
        return;
    }
    let tables = !args.iter().any(|a| a == "--small");
    let options = NcclOptions {
        op_timeout: OP_TIMEOUT,
        teardown_timeout: TEARDOWN_TIMEOUT,
        ..NcclOptions::default()
    };
    let gpus = match kolo_nccl::probe::platform() {
        Ok(p) => p.devices,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let ok = if under_mpirun() {
        process_mode(options, tables)
    } else {
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
            ok &= thread_mode(n, &options, tables);
        }
        ok
    };
    if !ok {
        println!("nccl_bench: FAILED");
        std::process::exit(1);
    }
}

/// Thread mode on `n` GPUs: the tables with copy engines, then without.
fn thread_mode(n: usize, options: &NcclOptions, tables: bool) -> bool {
    println!("== thread mode, {n} GPU(s) ==");
    let ctrls = match kolo_threads::communicators(n) {
        Ok(ctrls) => ctrls,
        Err(e) => {
            println!("FAIL thread mode on {n} GPUs: {e}");
            return false;
        }
    };
    let run = kolo_nccl::threads::run(ctrls, options.clone(), |comm, ctrl| {
        let copy = NcclOptions {
            copy_engine: CopyEngine::On,
            device: Some(comm.device().ordinal()),
            ..options.clone()
        };
        let mut ce = NcclComm::init(ctrl, copy)?;
        report::print(&mut ce, "thread mode, copy engines", tables);
        drop(ce);
        report::print(comm, "thread mode", tables);
        Ok(())
    });
    match run {
        Ok(_) => true,
        Err(e) => {
            println!("FAIL thread mode on {n} GPUs: {e}");
            false
        }
    }
}

/// This process as one rank of `mpirun`.
fn process_mode(options: NcclOptions, tables: bool) -> bool {
    let mut mpi = match MpiComm::init(false) {
        Ok(mpi) => mpi,
        Err(e) => {
            println!("FAIL: MPI init: {e}");
            return false;
        }
    };
    match NcclComm::init(&mut mpi, options) {
        Ok(mut comm) => {
            report::print(&mut comm, "process mode", tables);
            true
        }
        Err(e) => {
            println!("FAIL: NcclComm::init over MPI: {e}");
            false
        }
    }
}
