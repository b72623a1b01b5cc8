//! kolo-conformance's suite on NCCL's device data plane: every case's
//! buffers in GPU memory (`run_suite_on::<Cuda, _>` over a
//! [`CudaBackend`]), in thread mode (one thread per GPU, for 1 and 2 GPUs
//! or `--gpus N`, repeatable; copy engines off, then on) and in process
//! mode (run directly, it re-runs itself under `mpirun` with 1 and 2
//! processes, or `--np N`; under `mpirun` it is one rank). Without a GPU
//! it prints `skipped: no CUDA device (reason)` and exits 0.
//!
//! What the device path leaves out, and why, is printed first (see
//! [`device_options`]): nothing is skipped silently.

use kolo_conformance::{run_suite_on, Report, SuiteOptions};
use kolo_mpi::launcher::{mpirun_self, under_mpirun};
use kolo_mpi::MpiComm;
use kolo_nccl::{CopyEngine, Cuda, CudaBackend, NcclComm, NcclOptions, Teardown};
use kolo_protocol::DataType;
use kolo_transport::{Controller, Topology};
use std::time::Duration;

/// The bound on every GPU operation: a hang fails, it does not stall.
const OP_TIMEOUT: Duration = Duration::from_secs(120);
/// Ranks may reach teardown seconds apart.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// The suite as the device path runs it: every dtype (small cases) and
/// the default large ones, the control plane, and
/// - no `send_recv` case (`unordered_p2p: false`): it receives messages
///   in another order than they were sent, but NCCL has no tags and
///   matches a pair's messages in the order sent;
/// - u16 and i16 reductions checked to fail as `Unsupported`
///   (`unsupported_reductions`): NCCL has no 16-bit integer type; their
///   data movement runs as for every other dtype.
fn device_options() -> SuiteOptions {
    SuiteOptions {
        unordered_p2p: false,
        unsupported_reductions: vec![DataType::U16, DataType::I16],
        ..SuiteOptions::default()
    }
}

fn print_exclusions(opts: &SuiteOptions) {
    let names: Vec<&str> = opts.dtypes.iter().map(|d| d.name()).collect();
    println!("dtypes: {}", names.join(", "));
    if !opts.unordered_p2p {
        println!(
            "excluded: send_recv (receives in another order than sent; NCCL matches a pair's messages in order, without tags)"
        );
    }
    for dtype in &opts.unsupported_reductions {
        println!(
            "excluded: {} reductions, checked to fail as Unsupported (NCCL has no 16-bit integer type)",
            dtype.name()
        );
    }
}

fn options(copy_engine: CopyEngine) -> NcclOptions {
    NcclOptions {
        op_timeout: OP_TIMEOUT,
        teardown_timeout: TEARDOWN_TIMEOUT,
        copy_engine,
        ..NcclOptions::default()
    }
}

/// The suite on `comm`'s device memory; one line saying how it went.
fn suite<C: Controller + ?Sized>(comm: &mut NcclComm, ctrl: &mut C, label: &str) -> bool {
    let rank = comm.rank();
    let outcome: Result<Report, String> = {
        let mut backend = CudaBackend::new(comm, ctrl);
        run_suite_on::<Cuda, _>(&mut backend, &device_options()).map_err(|f| f.to_string())
    };
    let healthy = comm.check_health().map_err(|e| e.to_string());
    match outcome.and_then(|report| healthy.map(|()| report)) {
        Ok(report) => {
            println!("rank {rank}: passed device conformance ({label}): {report}");
            true
        }
        Err(why) => {
            println!("rank {rank}: FAIL device conformance ({label}): {why}");
            false
        }
    }
}

/// Closes `comm`; false unless it finalized.
fn close(comm: NcclComm, label: &str) -> bool {
    let rank = comm.rank();
    match comm.close() {
        Teardown::Finalized => true,
        other => {
            println!("rank {rank}: FAIL teardown ({label}): {other:?}");
            false
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if under_mpirun() {
        std::process::exit(rank_main());
    }
    let gpus = match kolo_nccl::probe::platform() {
        Ok(p) => {
            println!(
                "{} GPU(s), NCCL {}",
                p.devices,
                kolo_nccl::probe::version_string(p.nccl_version)
            );
            p.devices
        }
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    print_exclusions(&device_options());
    let wanted = |flag: &str| -> Vec<usize> {
        let given: Vec<usize> = args
            .windows(2)
            .filter(|w| w[0] == flag)
            .filter_map(|w| w[1].parse().ok())
            .collect();
        match (given.is_empty(), args.is_empty()) {
            (false, _) => given,
            (true, true) => vec![1, 2],
            (true, false) => Vec::new(),
        }
    };
    let mut ok = true;
    for n in wanted("--gpus") {
        if n > gpus {
            println!("skipped: thread mode on {n} GPUs needs {n}, {gpus} visible");
            continue;
        }
        ok &= threads(n);
    }
    for np in wanted("--np") {
        if np > gpus {
            println!("skipped: {np} processes need {np} GPUs, {gpus} visible");
            continue;
        }
        ok &= processes(np);
    }
    if !ok {
        println!("gpu_conformance: FAILED");
        std::process::exit(1);
    }
    println!("gpu_conformance: all checks passed");
}

/// Thread mode on `n` GPUs: the suite with copy engines off, then on.
fn threads(n: usize) -> bool {
    println!("== thread mode, {n} GPU(s) ==");
    let ctrls = match kolo_threads::communicators(n) {
        Ok(ctrls) => ctrls,
        Err(e) => {
            println!("FAIL thread mode on {n} GPUs: {e}");
            return false;
        }
    };
    let results = kolo_nccl::threads::run(ctrls, options(CopyEngine::Off), |comm, ctrl| {
        let label = format!("thread mode, {n} GPU(s)");
        let mut ok = suite(comm, ctrl, &label);
        let copy = NcclOptions {
            device: Some(comm.device().ordinal()),
            ..options(CopyEngine::On)
        };
        let label = format!("thread mode, {n} GPU(s), copy engines");
        match NcclComm::init(ctrl, copy) {
            Ok(mut ce) => {
                ok &= suite(&mut ce, ctrl, &label);
                ok &= close(ce, &label);
            }
            Err(e) => {
                println!("rank {}: FAIL {label}: init: {e}", comm.rank());
                ok = false;
            }
        }
        Ok(ok)
    });
    match results {
        Ok(oks) => oks.iter().all(|&ok| ok),
        Err(e) => {
            println!("FAIL thread mode on {n} GPUs: {e}");
            false
        }
    }
}

/// Process mode: this program under `mpirun -np np`.
fn processes(np: usize) -> bool {
    println!("== process mode: mpirun -np {np} ==");
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            println!("FAIL: cannot find this executable: {e}");
            return false;
        }
    };
    let envs = [("NCCL_NVLS_ENABLE", "0")];
    match mpirun_self(
        &exe,
        np,
        Vec::<&str>::new(),
        &envs,
        Duration::from_secs(1200),
    ) {
        Ok(out) => {
            print!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            if !out.status.success() {
                println!("FAIL: mpirun -np {np} exited with {}", out.status);
            }
            out.status.success()
        }
        Err(e) => {
            println!("FAIL: mpirun -np {np}: {e}");
            false
        }
    }
}

/// One rank under `mpirun`: the communicator over MPI, the suite, and the
/// ranks' agreement on the outcome (the exit status).
fn rank_main() -> i32 {
    let mut mpi = match MpiComm::init(false) {
        Ok(mpi) => mpi,
        Err(e) => {
            println!("FAIL: MPI init: {e}");
            return 1;
        }
    };
    let label = format!("process mode, {} rank(s)", mpi.size());
    let ok = match NcclComm::init(&mut mpi, options(CopyEngine::Off)) {
        Ok(mut comm) => {
            let passed = suite(&mut comm, &mut mpi, &label);
            close(comm, &label) && passed
        }
        Err(e) => {
            println!("rank {}: FAIL NcclComm::init over MPI: {e}", mpi.rank());
            false
        }
    };
    let verdicts = mpi.allgather_bytes(&[u8::from(ok)]).unwrap_or_default();
    i32::from(!(verdicts.len() == mpi.size() && verdicts.iter().all(|v| v.as_slice() == [1])))
}
