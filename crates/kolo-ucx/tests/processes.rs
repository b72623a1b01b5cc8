//! The kolo-conformance suite on the UCX backend, as a cluster runs it:
//! separate processes that meet through kolo-rendezvous on loopback, at 2,
//! 3 and 4 processes, once with `UCX_TLS` set to shared memory and once to
//! TCP. `cargo test` runs this binary directly; it then starts itself once
//! per rank with torchrun's variables (as `kolo-run` sets them), and each
//! rank runs the suite and its control plane checks.

use kolo_conformance::{random_cases, run_random_cases, run_suite, RandomOp, SuiteOptions};
use kolo_transport::{BitOp, Controller, Topology};
use kolo_ucx::UcxComm;
use std::process::ExitCode;
use std::time::Duration;

/// The transports of each job: shared memory, then TCP (with `self`, the
/// transport of a rank's messages to itself).
const TRANSPORTS: [(&str, &str); 2] = [("sm", "sm,self"), ("tcp", "tcp,self")];
/// How long one job may take.
const JOB_BOUND: Duration = Duration::from_secs(300);

fn main() -> ExitCode {
    if std::env::var_os("RANK").is_some() {
        return match rank_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(why) => {
                eprintln!("FAILED: {why}");
                ExitCode::FAILURE
            }
        };
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut failed = Vec::new();
    for (name, tls) in TRANSPORTS {
        for np in [2usize, 3, 4] {
            let job = format!("ucx_conformance_{name}_np{np}");
            match run_job(&exe, np, tls) {
                Ok(()) => println!("test {job} ... ok"),
                Err(why) => {
                    println!("test {job} ... FAILED\n{why}");
                    failed.push(job);
                }
            }
        }
    }
    if failed.is_empty() {
        println!("test result: ok. {} passed; 0 failed", TRANSPORTS.len() * 3);
        ExitCode::SUCCESS
    } else {
        println!("test result: FAILED. failed: {failed:?}");
        ExitCode::FAILURE
    }
}

/// Runs `np` ranks of this binary with `UCX_TLS=tls` (as `kolo-run`
/// starts them): every rank must succeed within the bound.
fn run_job(exe: &std::path::Path, np: usize, tls: &str) -> Result<(), String> {
    let env = [("UCX_TLS", tls), ("KOLO_RENDEZVOUS_TIMEOUT", "60")];
    let ranks = kolo_run::run_captured(np, exe, &[], &env, JOB_BOUND)?;
    let report: String = ranks
        .iter()
        .filter(|r| !r.succeeded())
        .map(|r| {
            format!(
                "rank {} ended with {:?}:\n{}{}\n",
                r.rank, r.status, r.stdout, r.stderr
            )
        })
        .collect();
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

/// One rank: the suite (the quick subset beyond 2 processes, which
/// oversubscribe CI's 2 cores), random sequences of collectives, and the
/// control plane's messages.
fn rank_main() -> Result<(), String> {
    let mut comm = UcxComm::from_env().map_err(|e| format!("joining: {e}"))?;
    let rank = comm.rank();
    let base = if comm.size() <= 2 {
        SuiteOptions::default()
    } else {
        SuiteOptions::quick()
    };
    // UCX's sends of large messages wait for their receiver (rendezvous
    // protocol), as MPI's do: receives out of send order do not apply.
    let opts = SuiteOptions {
        unordered_p2p: false,
        ..base
    };
    let report = run_suite(&mut comm, &opts).map_err(|e| format!("rank {rank}: {e}"))?;
    let cases: Vec<_> = random_cases(0x0075_6378, 16, 4096)
        .into_iter()
        .filter(|case| case.op != RandomOp::SendRecvTags)
        .collect();
    run_random_cases(&mut comm, &cases).map_err(|e| format!("rank {rank}, random: {e}"))?;
    control_plane(&mut comm).map_err(|e| format!("rank {rank}, control plane: {e}"))?;
    if rank == 0 {
        println!("rank 0: {report:?}");
    }
    Ok(())
}

/// Messages of every length through the control plane, and the bitwise
/// allreduce.
fn control_plane(comm: &mut UcxComm) -> Result<(), String> {
    let (rank, size) = (comm.rank(), comm.size());
    for len in [0usize, 1, 100, 70_000] {
        let mine: Vec<u8> = (0..len).map(|i| (i + rank) as u8).collect();
        let all = comm.allgather_bytes(&mine).map_err(|e| e.to_string())?;
        for (peer, got) in all.iter().enumerate() {
            let want: Vec<u8> = (0..len).map(|i| (i + peer) as u8).collect();
            if *got != want {
                return Err(format!("allgather of {len} bytes: rank {peer}'s differ"));
            }
        }
    }
    let mut words = vec![1u64 << rank, u64::MAX];
    comm.bitwise_allreduce(&mut words, BitOp::Or)
        .map_err(|e| e.to_string())?;
    if words[0] != (1u64 << size) - 1 {
        return Err(format!("OR of the rank bits: {:#x}", words[0]));
    }
    comm.control_barrier().map_err(|e| e.to_string())
}
