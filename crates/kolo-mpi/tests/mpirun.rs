//! The kolo-conformance suite on the MPI backend under a real `mpirun`.
//!
//! `cargo test` runs this binary directly; it then re-runs itself under
//! `mpirun -np 2`, `-np 3` and `-np 4`, where each process is one rank that
//! runs the suite on `MpiComm`'s native MPI collectives and on kolo's
//! generic point-to-point algorithms over MPI send / recv.

use kolo_conformance::{random_cases, run_random_cases, run_suite, RandomOp, SuiteOptions};
use kolo_mpi::launcher::{mpirun_self, under_mpirun};
use kolo_mpi::MpiComm;
use kolo_transport::{Generic, Topology};
use std::time::{Duration, Instant};

fn main() {
    if under_mpirun() {
        std::process::exit(match rank_main() {
            Ok(()) => 0,
            Err(message) => {
                eprintln!("{message}");
                1
            }
        });
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this test binary: {e}");
            std::process::exit(1);
        }
    };
    let mut failed = 0;
    let sizes = [2usize, 3, 4];
    for np in sizes {
        let name = format!("mpi_conformance_np{np}");
        match mpirun_self(
            &exe,
            np,
            std::iter::empty::<&str>(),
            &[],
            Duration::from_secs(600),
        ) {
            Ok(out) if out.status.success() => {
                println!("test {name} ... ok");
                print!("{}", String::from_utf8_lossy(&out.stdout));
            }
            Ok(out) => {
                failed += 1;
                println!("test {name} ... FAILED ({})", out.status);
                println!("stdout:\n{}", String::from_utf8_lossy(&out.stdout));
                println!("stderr:\n{}", String::from_utf8_lossy(&out.stderr));
            }
            Err(message) => {
                failed += 1;
                println!("test {name} ... FAILED\n{message}");
            }
        }
    }
    let passed = sizes.len() - failed;
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed > 0 {
        std::process::exit(1);
    }
}

/// One rank: native MPI collectives, then the generic algorithms over MPI
/// point-to-point, then random sequences of collectives.
fn rank_main() -> Result<(), String> {
    let mut comm = MpiComm::init(false).map_err(|e| format!("MPI init: {e}"))?;
    let rank = comm.rank();
    // The full suite (every dtype, large cases) on 2 processes; the quick
    // subset on 3 and 4, which oversubscribe CI's 2 cores, where every MPI
    // message waits for a scheduler slot. MPI sends may wait for their
    // receiver (rendezvous above the eager limit), so the out-of-order
    // receive check does not apply.
    let base = if comm.size() <= 2 {
        SuiteOptions::default()
    } else {
        SuiteOptions::quick()
    };
    let opts = SuiteOptions {
        unordered_p2p: false,
        ..base
    };
    let started = Instant::now();
    let native =
        run_suite(&mut comm, &opts).map_err(|e| format!("rank {rank}, native MPI: {e}"))?;
    let native_time = started.elapsed();
    // The generic algorithms are covered for every size on the threads
    // backend; here they run once more over real MPI point-to-point.
    let started = Instant::now();
    let quick = SuiteOptions {
        unordered_p2p: false,
        ..SuiteOptions::quick()
    };
    let generic = run_suite(&mut Generic(&mut comm), &quick)
        .map_err(|e| format!("rank {rank}, generic algorithms over MPI: {e}"))?;
    let generic_time = started.elapsed();
    let cases: Vec<_> = random_cases(0x6b6f_6c6f, 24, 4096)
        .into_iter()
        .filter(|case| case.op != RandomOp::SendRecvTags)
        .collect();
    let random = run_random_cases(&mut comm, &cases)
        .map_err(|e| format!("rank {rank}, random sequence: {e}"))?;
    if rank == 0 {
        println!(
            "  native: {native} ({native_time:.1?})\n  generic: {generic} ({generic_time:.1?})\n  random: {random}"
        );
    }
    Ok(())
}
