//! The engine suite (`tests/engine-suite`, the cases the threads and MPI
//! backends run) over UCX: separate processes that meet through
//! kolo-rendezvous, as kolo-run starts them, each with its own engine
//! (`Kolo::init_ucx`). The main sequence at 2, 3 and 4 processes over
//! shared memory and over TCP, the submission-order jobs at 2, the
//! operation timeout at 3 over TCP, a rank frozen by SIGSTOP at 3 and a
//! link set down between two hosts (network namespaces) at 4, and
//! the train example as four processes (`--backend ucx`).
//! With `nccl` too, `Kolo::init_nccl_ucx` at 2 and 3 processes: NCCL's
//! bootstrap through the rendezvous store either starts every rank's GPU
//! engine (a host allreduce then runs on it) or fails on every rank with
//! the same cause, naming NCCL and the rank (where there is no GPU).
//!
//! `cargo test` runs this binary directly (`harness = false`); it starts
//! each job's ranks as copies of itself, which print a `kolo-case` line
//! per case, and judges every case of every job, libtest style.

use kolo::{Config, Kolo};
use kolo_engine_suite::{judge, run_rank, Case, CaseLine, Job};
use kolo_run::netns::{run_on_hosts, Hosts};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// How long one job may take (4 processes share CI's 2 cores).
const JOB_BOUND: Duration = Duration::from_secs(300);

/// kolo-fusion packs fused allreduces over UCX (no allreduce over
/// segments in place).
const PACKS: bool = true;

/// Where a job's ranks run.
#[derive(Clone, Copy)]
enum Place {
    /// On this host, over these UCX transports.
    Local(&'static str),
    /// Half on each of two hosts made of network namespaces, over TCP
    /// (see `kolo_run::netns`).
    TwoHosts,
}

/// Every job, with where it runs.
fn jobs() -> Vec<(Job, Place)> {
    use Place::{Local, TwoHosts};
    let mut jobs: Vec<(Job, Place)> = [2, 3, 4]
        .into_iter()
        .map(|np| (Job::main(np, &[]), Local("sm,self")))
        .collect();
    for np in [2, 3, 4] {
        let mut tcp = Job::main(np, &[]);
        tcp.name = format!("main_np{np}_tcp");
        jobs.push((tcp, Local("tcp,self")));
    }
    jobs.extend(
        kolo_engine_suite::order_jobs(&[2])
            .into_iter()
            .map(|job| (job, Local("sm,self"))),
    );
    jobs.push((Job::timeout(3), Local("tcp,self")));
    jobs.push((
        Job::new(
            "link_down_np4",
            4,
            vec![Case::new(
                "a_link_down_times_out_on_every_rank_naming_the_far_ranks",
                link_down,
            )],
        )
        .with_settings(|config| config.timeout(Duration::from_secs(2))),
        TwoHosts,
    ));
    jobs.push((
        Job::new(
            "frozen_np3",
            3,
            vec![Case::new(
                "a_frozen_rank_times_out_on_the_others_naming_it",
                frozen_rank,
            )],
        )
        .with_settings(|config| config.timeout(Duration::from_secs(1))),
        Local("tcp,self"),
    ));
    jobs
}

/// Four ranks, two on each of two hosts (network namespaces joined by a
/// link). After some allreduces rank 0 sets its end of the link down:
/// nothing fails at once (TCP retransmits into the void), so the watchdog
/// ends every rank's wait. Each fails within the bound with a timeout (or
/// the loss of a rank of the other host, should UCX notice first), its
/// report naming the ranks it could not hear from.
fn link_down(kolo: &Kolo) -> Result<Option<u64>, kolo::Error> {
    use kolo::{Error, ReduceOp};
    const CUT_AT: usize = 5;
    let rank = kolo.rank();
    let mut x = [1f32; 1024];
    let mut cut = None;
    for step in 0..1000 {
        if step == CUT_AT {
            // Every rank is past step CUT_AT - 1; none can finish this one.
            if rank == 0 {
                let device = std::env::var("KOLO_NETNS_DEVICE").unwrap_or_default();
                let down = std::process::Command::new("ip")
                    .args(["link", "set", &device, "down"])
                    .status();
                assert!(
                    down.is_ok_and(|s| s.success()),
                    "ip link set {device} down failed"
                );
            }
            cut = Some(std::time::Instant::now());
        }
        match kolo.allreduce(&format!("link/{step}"), &mut x, ReduceOp::Max) {
            Ok(()) => assert!(step < CUT_AT, "rank {rank}: step {step} went through"),
            Err(err) => {
                assert!(step >= CUT_AT, "rank {rank}: step {step} failed: {err}");
                let waited = cut.map(|at| at.elapsed()).unwrap_or_default();
                assert!(waited < Duration::from_secs(30), "{waited:?}: {err}");
                let far = if rank < 2 { [2, 3] } else { [0, 1] };
                match &err {
                    Error::Timeout { report, .. } => assert!(
                        report.contains("did not report")
                            && far.iter().all(|r| report.contains(&r.to_string())),
                        "rank {rank}: {err}"
                    ),
                    Error::RankFailed { rank: lost, .. } => {
                        assert!(far.contains(lost), "rank {rank}: {err}")
                    }
                    other => panic!("rank {rank}: expected a timeout, got {other:?}"),
                }
                println!("rank {rank}: step {step} failed after {waited:?}: {err}");
                return Ok(None);
            }
        }
    }
    panic!("rank {rank}: no step failed");
}

/// How long rank 2 of [`frozen_rank`] stays stopped.
const FROZEN: Duration = Duration::from_secs(8);

/// Rank 2 of 3 stops (SIGSTOP) for [`FROZEN`], far past the 1 s operation
/// timeout: its process and connections live, so nothing tells the others,
/// whose engines wait for it inside UCX, not in negotiation. Their
/// watchdogs end the wait: both fail with `Error::Timeout` naming the
/// tensor, and rank 0's report names rank 2 as the rank that did not
/// report. Rank 2 resumes (a child of it sends SIGCONT) and its call
/// fails too, bounded.
fn frozen_rank(kolo: &Kolo) -> Result<Option<u64>, kolo::Error> {
    use kolo::{Error, ReduceOp};
    let rank = kolo.rank();
    kolo.barrier()?;
    let mut x = [1f32; 4];
    if rank == 2 {
        let pid = std::process::id();
        let resume = format!("sleep {}; kill -CONT {pid}", FROZEN.as_secs());
        let waker = std::process::Command::new("sh")
            .args(["-c", &resume])
            .spawn();
        if waker.is_ok() {
            let _ = std::process::Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .status();
        }
        let _ = kolo.allreduce("frozen/x", &mut x, ReduceOp::Sum);
        return Ok(None);
    }
    let started = std::time::Instant::now();
    let err = kolo_engine_suite::expect_err(
        kolo.allreduce("frozen/x", &mut x, ReduceOp::Sum),
        "frozen/x",
    );
    let waited = started.elapsed();
    match &err {
        Error::Timeout { tensor, report, .. } => {
            assert_eq!(tensor, "frozen/x", "{err}");
            assert!(report.contains("first pending op"), "{err}");
            if rank == 0 {
                assert!(
                    report.contains("rank 2 did not report"),
                    "rank 0's report does not name rank 2: {err}"
                );
            }
        }
        other => panic!("rank {rank}: expected a timeout, got {other:?}"),
    }
    assert!(waited < FROZEN, "the timeout came after {waited:?}");
    Ok(None)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone());
    if let (Some(job), Some(dir)) = (arg("--job"), arg("--dir")) {
        return rank_main(&job, Path::new(&dir));
    }
    #[cfg(feature = "nccl")]
    if args.iter().any(|a| a == "--nccl-rank") {
        return nccl::rank_main();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut failed = Vec::new();
    let mut passed = 0;
    for (job, place) in jobs() {
        let dir_arg = dir.path().display().to_string();
        let args = ["--job", job.name.as_str(), "--dir", &dir_arg];
        let env = [("KOLO_CYCLE_TIME", "1"), ("KOLO_RENDEZVOUS_TIMEOUT", "60")];
        let started = match place {
            Place::Local(tls) => {
                let env = [env.as_slice(), &[("UCX_TLS", tls)]].concat();
                kolo_run::run_captured(job.ranks, &exe, &args, &env, JOB_BOUND)
            }
            Place::TwoHosts if !Hosts::enabled() => {
                println!("note: {} left out (KOLO_NETNS_TESTS=0)", job.name);
                continue;
            }
            Place::TwoHosts => Hosts::make(1).and_then(|hosts| {
                run_on_hosts(&hosts, job.ranks / 2, &exe, &args, &env, JOB_BOUND)
            }),
        };
        let ranks = match started {
            Ok(ranks) => ranks,
            Err(why) => {
                println!("test {}::start ... FAILED\n{why}", job.name);
                failed.push(job.name.clone());
                continue;
            }
        };
        let lines: Vec<CaseLine> = ranks
            .iter()
            .flat_map(|r| r.stdout.lines().filter_map(CaseLine::parse))
            .collect();
        for verdict in judge(&job, &lines, dir.path(), PACKS) {
            match verdict.failure {
                None => {
                    passed += 1;
                    println!("test {} ... ok", verdict.name);
                }
                Some(why) => {
                    println!("test {} ... FAILED\n{why}", verdict.name);
                    failed.push(verdict.name);
                }
            }
        }
        for rank in ranks.iter().filter(|r| !r.succeeded()) {
            println!(
                "test {}::rank{}_exits_0 ... FAILED ({:?})\n{}",
                job.name, rank.rank, rank.status, rank.stderr
            );
            failed.push(format!("{}::rank{}", job.name, rank.rank));
        }
    }
    match train_example(&exe) {
        Ok(()) => {
            passed += 1;
            println!("test train_example_np4 ... ok");
        }
        Err(why) => {
            println!("test train_example_np4 ... FAILED\n{why}");
            failed.push("train_example_np4".into());
        }
    }
    #[cfg(feature = "nccl")]
    for np in [2, 3] {
        let name = format!("init_nccl_ucx_np{np}");
        match nccl::job(&exe, np) {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok");
            }
            Err(why) => {
                println!("test {name} ... FAILED\n{why}");
                failed.push(name);
            }
        }
    }
    if failed.is_empty() {
        println!("test result: ok. {passed} passed; 0 failed");
        ExitCode::SUCCESS
    } else {
        println!("test result: FAILED. {passed} passed; failed: {failed:?}");
        ExitCode::FAILURE
    }
}

/// The train example (`--backend ucx`) as four processes under kolo-run's
/// library, as the README starts it: every rank exits 0 and rank 0 reports
/// the parameters bitwise identical on all four.
fn train_example(exe: &Path) -> Result<(), String> {
    // The test runs from target/<profile>/deps; cargo builds the package's
    // examples into target/<profile>/examples when it runs its tests whole.
    let example = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("examples").join("train"))
        .ok_or("no target/<profile> above the test binary")?;
    if !example.exists() {
        return Err(format!(
            "{} not built: run the package's tests whole (`cargo test -p kolo --features ucx`), which builds its examples",
            example.display()
        ));
    }
    let env = [("UCX_TLS", "sm,self"), ("KOLO_RENDEZVOUS_TIMEOUT", "60")];
    let ranks = kolo_run::run_captured(4, &example, &["--backend", "ucx"], &env, JOB_BOUND)?;
    for rank in &ranks {
        if !rank.succeeded() {
            return Err(format!(
                "rank {}: {:?}\n{}\n{}",
                rank.rank, rank.status, rank.stdout, rank.stderr
            ));
        }
    }
    let want = "all 4 ranks (UCX processes) hold bitwise identical parameters";
    match ranks.iter().find(|r| r.rank == 0) {
        Some(rank) if rank.stdout.contains(want) => Ok(()),
        Some(rank) => Err(format!("rank 0 did not say {want:?}:\n{}", rank.stdout)),
        None => Err("no rank 0".into()),
    }
}

/// One rank of `name`: its engine over UCX, every case, a line each.
fn rank_main(name: &str, dir: &Path) -> ExitCode {
    let Some((job, _)) = jobs().into_iter().find(|(j, _)| j.name == name) else {
        eprintln!("no job {name}");
        return ExitCode::FAILURE;
    };
    let config = match Config::from_env() {
        Ok(config) => job.configure(config, dir),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let kolo = match Kolo::init_ucx(config) {
        Ok(kolo) => kolo,
        Err(e) => {
            eprintln!("Kolo::init_ucx: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = run_rank(&kolo, &job.cases, &mut |line| println!("{line}"));
    drop(kolo);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("{why}");
            ExitCode::FAILURE
        }
    }
}

/// `Kolo::init_nccl_ucx` under kolo-run.
#[cfg(feature = "nccl")]
mod nccl {
    use super::JOB_BOUND;
    use kolo::{Config, Error, Kolo, ReduceOp};
    use std::path::Path;
    use std::process::ExitCode;

    /// One rank: start, then (if started) one host allreduce; prints
    /// `kolo-nccl-start ok <sum>` or `kolo-nccl-start err <message>`.
    pub fn rank_main() -> ExitCode {
        match Kolo::init_nccl_ucx(Config::default()) {
            Ok(kolo) => {
                let mut x = [kolo.rank() as f32 + 1.0];
                let outcome = kolo.allreduce("x", &mut x[..], ReduceOp::Sum);
                let shut = kolo.shutdown();
                match outcome.and(shut) {
                    Ok(()) => println!("kolo-nccl-start ok {}", x[0]),
                    Err(e) => println!("kolo-nccl-start failed-after-start {e}"),
                }
            }
            Err(Error::Start { message }) => println!("kolo-nccl-start err {message}"),
            Err(e) => println!("kolo-nccl-start other {e}"),
        }
        ExitCode::SUCCESS
    }

    /// Every rank started, or every rank failed naming NCCL and itself.
    pub fn job(exe: &Path, np: usize) -> Result<(), String> {
        let env = [("UCX_TLS", "sm,self"), ("KOLO_RENDEZVOUS_TIMEOUT", "60")];
        let ranks = kolo_run::run_captured(np, exe, &["--nccl-rank"], &env, JOB_BOUND)?;
        let sum = (1..=np).sum::<usize>() as f32;
        let lines: Vec<(usize, String)> = ranks
            .iter()
            .map(|r| {
                let line = r.stdout.lines().find(|l| l.starts_with("kolo-nccl-start"));
                (r.rank, line.unwrap_or(&r.stderr).to_string())
            })
            .collect();
        let all_ok = lines
            .iter()
            .all(|(_, l)| *l == format!("kolo-nccl-start ok {sum}"));
        let all_err = lines.iter().all(|(rank, l)| {
            l.starts_with("kolo-nccl-start err ")
                && l.contains("NCCL")
                && l.contains(&format!("on rank {rank}"))
        });
        let exits = ranks.iter().all(|r| r.succeeded());
        if (all_ok || all_err) && exits && lines.len() == np {
            Ok(())
        } else {
            Err(format!("ranks disagree or fail unnamed: {lines:?}"))
        }
    }
}
