//! The kolo-conformance suite on the UCX backend, as a cluster runs it:
//! separate processes that meet through kolo-rendezvous on loopback, at 2,
//! 3 and 4 processes, once with `UCX_TLS` set to shared memory and once to
//! TCP. `cargo test` runs this binary directly; it then starts itself once
//! per rank with torchrun's variables (as `kolo-run` sets them), and each
//! rank runs the suite and its control plane checks. Over TCP the suite
//! runs on two rails (asked for: kolo takes one where the machine's cores
//! are too few for two, as on CI's); the second rail's thread lives
//! exactly as long as its communicator, an interrupted rail is the
//! allreduce's error, and unasked, the rail is taken where the cores allow.

mod namespaces;

use kolo_conformance::{random_cases, run_random_cases, run_suite, RandomOp, SuiteOptions};
use kolo_transport::{BitOp, Controller, Topology};
use kolo_ucx::UcxComm;
use std::process::ExitCode;
use std::time::Duration;

/// The transports of each job: shared memory, then TCP (with `self`, the
/// transport of a rank's messages to itself).
const TRANSPORTS: [(&str, &str); 2] = [("sm", "sm,self"), ("tcp", "tcp,self")];
/// How long one job may take.
pub(crate) const JOB_BOUND: Duration = Duration::from_secs(300);

fn main() -> ExitCode {
    if std::env::var_os("RANK").is_some() {
        let role = std::env::args().nth(1).unwrap_or_default();
        let outcome = match role.as_str() {
            "--killed" => killed_rank_main(),
            "--rail" => rail_rank_main(),
            "--rails-unasked" => rails_unasked_rank_main(),
            _ => rank_main(),
        };
        return match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(why) => {
                eprintln!("FAILED: {why}");
                ExitCode::FAILURE
            }
        };
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut jobs = Jobs::default();
    for (name, tls) in TRANSPORTS {
        for np in [2usize, 3, 4] {
            // TCP on two rails wherever it runs (see the module's docs).
            let rails = if name == "tcp" { "2" } else { "1" };
            jobs.report(
                &format!("ucx_conformance_{name}_np{np}"),
                run_job(&exe, np, &[], tls, rails),
            );
        }
    }
    jobs.report(
        "ucx_conformance_two_namespaces_tcp_np4",
        namespaces::job(&exe),
    );
    // Two ranks over TCP on two rails run `rail_rank_main`.
    jobs.report(
        "ucx_rail_thread_ends_with_its_communicator_tcp_np2",
        run_job(&exe, 2, &["--rail"], "tcp,self", "2"),
    );
    jobs.report(
        "ucx_rails_unasked_follow_the_cores_tcp_np2",
        run_job(&exe, 2, &["--rails-unasked"], "tcp,self", ""),
    );
    jobs.report("ucx_rank_killed_mid_collective_tcp_np3", killed_job(&exe));
    jobs.finish()
}

/// The jobs run so far, in the test harness's words.
#[derive(Default)]
struct Jobs {
    passed: usize,
    failed: Vec<String>,
}

impl Jobs {
    /// Prints `job`'s line and counts it.
    fn report(&mut self, job: &str, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                println!("test {job} ... ok");
                self.passed += 1;
            }
            Err(why) => {
                println!("test {job} ... FAILED\n{why}");
                self.failed.push(job.to_owned());
            }
        }
    }

    /// The summary line, and the exit status it implies.
    fn finish(self) -> ExitCode {
        if self.failed.is_empty() {
            println!("test result: ok. {} passed; 0 failed", self.passed);
            ExitCode::SUCCESS
        } else {
            println!("test result: FAILED. failed: {:?}", self.failed);
            ExitCode::FAILURE
        }
    }
}

/// Runs `np` ranks of this binary with `args`, `UCX_TLS=tls` and
/// `KOLO_UCX_RAILS=rails` (empty: kolo's choice) as `kolo-run` starts
/// them: every rank must succeed within the bound.
fn run_job(
    exe: &std::path::Path,
    np: usize,
    args: &[&str],
    tls: &str,
    rails: &str,
) -> Result<(), String> {
    let env = [
        ("UCX_TLS", tls),
        ("KOLO_RENDEZVOUS_TIMEOUT", "60"),
        ("KOLO_UCX_RAILS", rails),
    ];
    let ranks = kolo_run::run_captured(np, exe, args, &env, JOB_BOUND)?;
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

/// Threads of this process named `kolo-rail` (the second rail's).
fn rail_threads() -> Result<usize, String> {
    let tasks = std::fs::read_dir("/proc/self/task").map_err(|e| format!("/proc: {e}"))?;
    Ok(tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "kolo-rail")
        .count())
}

/// A rank of [`rail_job`]: the communicator has one rail thread, its 1 MiB
/// allreduce (over both rails) is right; interrupted, the allreduce fails
/// (on both rails) instead of hanging; dropped, its rail thread is gone.
fn rail_rank_main() -> Result<(), String> {
    use kolo_transport::{Collectives, Scale};
    let mut comm = UcxComm::from_env().map_err(|e| format!("joining: {e}"))?;
    let (rank, size) = (comm.rank(), comm.size());
    if rail_threads()? != 1 {
        return Err(format!("rank {rank}: {} rail threads", rail_threads()?));
    }
    let mut buf = vec![1.0f32; 1 << 18];
    comm.allreduce(&mut buf[..], kolo_protocol::ReduceOp::Sum, Scale::NONE)
        .map_err(|e| format!("rank {rank}: {e}"))?;
    if let Some(bad) = buf.iter().position(|&x| x != size as f32) {
        return Err(format!("rank {rank}: element {bad} is {}", buf[bad]));
    }
    comm.interrupter().interrupt("the test's interruption");
    match comm.allreduce(&mut buf[..], kolo_protocol::ReduceOp::Sum, Scale::NONE) {
        Err(e) if e.to_string().contains("the test's interruption") => {}
        other => {
            return Err(format!(
                "rank {rank}: interrupted, the allreduce gave {other:?}"
            ))
        }
    }
    drop(comm);
    match rail_threads()? {
        0 => Ok(()),
        n => Err(format!("rank {rank}: {n} rail threads after the drop")),
    }
}

/// A rank of the unasked-rails job (2 ranks of this machine over TCP):
/// kolo takes the second rail exactly where the machine has a core for
/// each rank's two waiting threads, and the allreduce is right either way.
fn rails_unasked_rank_main() -> Result<(), String> {
    use kolo_transport::{Collectives, Scale};
    let mut comm = UcxComm::from_env().map_err(|e| format!("joining: {e}"))?;
    let (rank, size) = (comm.rank(), comm.size());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let expected = usize::from(2 * size <= cores);
    if rail_threads()? != expected {
        return Err(format!(
            "rank {rank}: {} rail threads with {size} ranks on {cores} cores (expected {expected})",
            rail_threads()?
        ));
    }
    let mut buf = vec![1.0f32; 1 << 18];
    comm.allreduce(&mut buf[..], kolo_protocol::ReduceOp::Sum, Scale::NONE)
        .map_err(|e| format!("rank {rank}: {e}"))?;
    match buf.iter().position(|&x| x != size as f32) {
        Some(bad) => Err(format!("rank {rank}: element {bad} is {}", buf[bad])),
        None => Ok(()),
    }
}

/// How long the survivors may take to fail once a rank died.
const DETECTION_BOUND: Duration = Duration::from_secs(30);

/// Three ranks over TCP: rank 1 is killed (SIGKILL) in the middle of a
/// run of allreduces; ranks 0 and 2 must fail, naming rank 1, within
/// [`DETECTION_BOUND`], without a hang or a panic.
fn killed_job(exe: &std::path::Path) -> Result<(), String> {
    let env = [("UCX_TLS", "tcp,self"), ("KOLO_RENDEZVOUS_TIMEOUT", "60")];
    let ranks = kolo_run::run_captured(3, exe, &["--killed"], &env, JOB_BOUND)?;
    use std::os::unix::process::ExitStatusExt;
    let mut report = String::new();
    for r in &ranks {
        let ok = match r.rank {
            1 => r.status.and_then(|s| s.signal()) == Some(9),
            _ => r.succeeded() && r.stdout.contains("failed naming rank 1"),
        };
        if !ok {
            report.push_str(&format!(
                "rank {} ended with {:?}:\n{}{}\n",
                r.rank, r.status, r.stdout, r.stderr
            ));
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

/// A rank of [`killed_job`]: allreduces of 1 MiB until rank 1 kills itself
/// (after 20); the others report how their allreduce failed.
fn killed_rank_main() -> Result<(), String> {
    use kolo_transport::{Collectives, Scale, TransportError};
    let mut comm = UcxComm::from_env().map_err(|e| format!("joining: {e}"))?;
    let rank = comm.rank();
    let mut buf = vec![1.0f32; 1 << 18];
    let mut died_at = None;
    for step in 0..100_000 {
        if rank == 1 && step == 20 {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid])
                .status();
            std::thread::sleep(Duration::from_secs(60));
        }
        let started = std::time::Instant::now();
        match comm.allreduce(&mut buf[..], kolo_protocol::ReduceOp::Max, Scale::NONE) {
            Ok(()) => {}
            Err(TransportError::PeerFailed { rank: 1, message }) => {
                died_at = Some((step, started.elapsed(), message));
                break;
            }
            Err(other) => return Err(format!("step {step}: expected rank 1's loss, got {other}")),
        }
    }
    let Some((step, waited, message)) = died_at else {
        return Err("no step failed".into());
    };
    if waited > DETECTION_BOUND {
        return Err(format!("the loss took {waited:?} to notice"));
    }
    println!("rank {rank}: step {step} failed naming rank 1 after {waited:?}: {message}");
    Ok(())
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
