//! The kolo-conformance suite on the MPI backend under a real `mpirun`,
//! `MpiComm::duplicate` and `MpiComm::split`.
//!
//! `cargo test` runs this binary directly; it then re-runs itself under
//! `mpirun -np 2`, `-np 3` and `-np 4` (see `kolo_mpi::launcher`), where
//! each process is one rank that runs the suite on `MpiComm`'s native MPI
//! collectives and on kolo's generic point-to-point algorithms over MPI
//! send / recv, then checks that duplicates used from other threads at the
//! same time keep their messages apart, and splits the world into pairs
//! (see `mpirun_split`). A last job initialises MPI `FUNNELED` and checks
//! that `duplicate` refuses, naming the level, while `split` works.

mod mpirun_split;

use kolo_conformance::{random_cases, run_random_cases, run_suite, RandomOp, SuiteOptions};
use kolo_mpi::launcher::{self, Job};
use kolo_mpi::{MpiComm, MpiError, ThreadLevel};
use kolo_transport::{Collectives, Generic, Topology};
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let mut jobs: Vec<Job> = [2usize, 3, 4]
        .into_iter()
        .map(|np| Job::new(format!("mpi_conformance_np{np}"), np))
        .collect();
    jobs.push(Job::new("mpi_duplicate_refused_when_funneled_np2", 2).arg("--funneled"));
    launcher::main(jobs, |args| {
        if args.iter().any(|a| a == "--funneled") {
            funneled_refuses_duplicates()
        } else {
            rank_main()
        }
    })
}

/// One rank: native MPI collectives, then the generic algorithms over MPI
/// point-to-point, then random sequences of collectives, then duplicates.
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
    duplicates_keep_messages_apart(&mut comm)?;
    mpirun_split::splits_into_pairs(&mut comm)?;
    mpirun_split::bad_color_is_an_error(&mut comm)?;
    if rank == 0 {
        println!(
            "  native: {native} ({native_time:.1?})\n  generic: {generic} ({generic_time:.1?})\n  random: {random}\n  duplicates: ok\n  split: ok"
        );
    }
    Ok(())
}

/// Three duplicates, each driven by a thread of its own at the same time
/// as the original on this thread, all sending a ring message with the
/// same tag: each must receive its own communicator's message. Then the
/// quick conformance suite on a duplicate.
fn duplicates_keep_messages_apart(comm: &mut MpiComm) -> Result<(), String> {
    let (rank, size) = (comm.rank(), comm.size());
    if comm.thread_level() < ThreadLevel::Multiple {
        return Err(format!(
            "rank {rank}: MPI granted {}, the duplicate checks need MPI_THREAD_MULTIPLE",
            comm.thread_level()
        ));
    }
    let mut dups = Vec::new();
    for _ in 0..3 {
        dups.push(comm.duplicate().map_err(|e| format!("rank {rank}: {e}"))?);
    }
    let ring = |comm: &mut MpiComm, which: u32| -> Result<(), String> {
        let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
        let mine = vec![i64::from(which) * 1000 + rank as i64; 1 << 16];
        let mut got = vec![0i64; 1 << 16];
        comm.sendrecv(&mine, next, &mut got, prev, 7)
            .map_err(|e| format!("rank {rank}, communicator {which}: {e}"))?;
        let want = i64::from(which) * 1000 + prev as i64;
        if got.iter().any(|&v| v != want) {
            return Err(format!(
                "rank {rank}, communicator {which}: got {} from rank {prev}, want {want}",
                got[0]
            ));
        }
        Ok(())
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = dups
            .iter_mut()
            .enumerate()
            .map(|(i, dup)| scope.spawn(move || ring(dup, i as u32 + 1)))
            .collect();
        let mut outcome = ring(comm, 0);
        for handle in handles {
            let joined = handle
                .join()
                .unwrap_or_else(|_| Err(format!("rank {rank}: a duplicate's thread panicked")));
            outcome = outcome.and(joined);
        }
        outcome
    })?;
    let quick = SuiteOptions {
        unordered_p2p: false,
        ..SuiteOptions::quick()
    };
    let dup = dups.first_mut().ok_or("no duplicate")?;
    run_suite(dup, &quick).map_err(|e| format!("rank {rank}, suite on a duplicate: {e}"))?;
    Ok(())
}

/// With MPI initialised FUNNELED, `duplicate` is an error naming the level;
/// `split` (a communicator for this thread) works.
fn funneled_refuses_duplicates() -> Result<(), String> {
    let mut comm = MpiComm::init(true).map_err(|e| format!("MPI init: {e}"))?;
    let level = comm.thread_level();
    match comm.duplicate() {
        Err(e @ MpiError::ThreadLevel { .. }) if level < ThreadLevel::Multiple => {
            let text = e.to_string();
            if !text.contains(&level.to_string()) || !text.contains("MPI_THREAD_MULTIPLE") {
                return Err(format!("the error does not name the levels: {text}"));
            }
            if comm.rank() == 0 {
                println!("  {text}");
            }
        }
        Ok(_) if level == ThreadLevel::Multiple => {}
        other => {
            return Err(format!(
                "MPI granted {level}; duplicate gave {:?}",
                other.map(|_| "a communicator")
            ))
        }
    }
    mpirun_split::splits_into_pairs(&mut comm)
}
