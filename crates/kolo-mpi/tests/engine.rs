//! kolo's engine over MPI under a real `mpirun`: every operation, the
//! mismatch matrix, fusion, the response cache, thread levels, the
//! timeline, shutdown with pending handles, and a rank that fails
//! mid-training.
//!
//! `cargo test` runs this binary directly (it is `harness = false`); it then
//! starts jobs of itself under `mpirun` (see [`jobs`]), where each process
//! is one rank with its own engine (`Kolo::init_mpi`). Every rank runs every
//! case and prints a `kolo-case NAME RANK ok` line per case; a rank whose
//! case fails prints why and aborts the job (so no peer is left waiting).
//! This process then reports each case of each job, libtest style.

mod engine {
    pub mod cases;
    pub mod failure;
    pub mod mismatch;
    pub mod ops;
    pub mod outcome;
    pub mod timeline;
}

use engine::outcome::{self, Verdict};
use kolo::Kolo;
use kolo_mpi::launcher::{mpirun_self, under_mpirun};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The longest a job may take before it counts as hung (generous: CI
/// oversubscribes 4 processes on 2 cores).
const JOB_TIMEOUT: Duration = Duration::from_secs(300);

/// What the processes of a job do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Every case of [`engine::cases::CASES`], then a shutdown.
    Suite,
    /// Rank 1 panics mid-training.
    FailPanic,
    /// Rank 1's process exits mid-training without finalising MPI.
    FailExit,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Suite => "suite",
            Role::FailPanic => "fail-panic",
            Role::FailExit => "fail-exit",
        }
    }

    fn parse(text: &str) -> Option<Role> {
        [Role::Suite, Role::FailPanic, Role::FailExit]
            .into_iter()
            .find(|r| r.name() == text)
    }
}

/// One `mpirun` job.
struct Job {
    name: String,
    np: usize,
    role: Role,
    env: Vec<(&'static str, String)>,
}

/// The jobs: the suite at 2, 3 and 4 processes with the default settings
/// (and a timeline), the suite at 3 processes with the response cache and
/// fusion off and `KOLO_MPI_THREADS_DISABLE=1`, and the two failures.
fn jobs(dir: &Path) -> Vec<Job> {
    let mut jobs: Vec<Job> = [2, 3, 4]
        .into_iter()
        .map(|np| Job {
            name: format!("engine_np{np}"),
            np,
            role: Role::Suite,
            env: vec![(
                "KOLO_TIMELINE",
                timeline_path(dir, np).display().to_string(),
            )],
        })
        .collect();
    jobs.push(Job {
        name: "engine_np3_no_cache_no_fusion_funneled".into(),
        np: 3,
        role: Role::Suite,
        env: vec![
            ("KOLO_CACHE_CAPACITY", "0".into()),
            ("KOLO_FUSION_THRESHOLD", "0".into()),
            ("KOLO_MPI_THREADS_DISABLE", "1".into()),
        ],
    });
    jobs.push(Job {
        name: "rank1_panics_np3".into(),
        np: 3,
        role: Role::FailPanic,
        env: Vec::new(),
    });
    jobs.push(Job {
        name: "rank1_exits_np2".into(),
        np: 2,
        role: Role::FailExit,
        env: Vec::new(),
    });
    jobs
}

fn timeline_path(dir: &Path, np: usize) -> std::path::PathBuf {
    dir.join(format!("timeline-np{np}.json"))
}

/// Settings every job shares: a short cycle (idle ranks answer quickly)
/// and OpenMPI yielding the CPU while it waits (4 busy-polling processes on
/// 2 cores would starve each other).
fn common_env() -> Vec<(&'static str, String)> {
    vec![
        ("KOLO_CYCLE_TIME", "1".into()),
        ("OMPI_MCA_mpi_yield_when_idle", "1".into()),
    ]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if under_mpirun() {
        return match args.iter().position(|a| a == "--role") {
            Some(i) => match args.get(i + 1).and_then(|r| Role::parse(r)) {
                Some(role) => rank_main(role),
                None => {
                    eprintln!("unknown --role in {args:?}");
                    ExitCode::FAILURE
                }
            },
            // Started by mpirun without a role: not one of our jobs.
            None => {
                eprintln!("engine test: run it through cargo test, not mpirun");
                ExitCode::FAILURE
            }
        };
    }
    // libtest's flags (`--list`, filters) are not supported; `--list` must
    // not start MPI jobs.
    if args.iter().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    harness()
}

/// The parent: runs every job and reports each of its cases.
fn harness() -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this test binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let mut verdicts: Vec<Verdict> = Vec::new();
    let mut digests = Vec::new();
    for job in jobs(dir.path()) {
        let mut env = common_env();
        env.extend(job.env.iter().cloned());
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let t0 = Instant::now();
        let result = mpirun_self(&exe, job.np, ["--role", job.role.name()], &env, JOB_TIMEOUT);
        println!(
            "# {} (mpirun -np {}): {:.1} s",
            job.name,
            job.np,
            t0.elapsed().as_secs_f64()
        );
        let mut job_verdicts = match job.role {
            Role::Suite => {
                let mut v = outcome::suite(&job.name, job.np, &result);
                if let Ok(output) = result.as_ref() {
                    digests.push((job.name.clone(), job.np, outcome::digests(output)));
                }
                if job.env.iter().any(|(k, _)| *k == "KOLO_TIMELINE") {
                    v.push(engine::timeline::check(
                        &job.name,
                        &timeline_path(dir.path(), job.np),
                        job.np,
                    ));
                }
                v
            }
            Role::FailPanic | Role::FailExit => vec![outcome::failure(&job.name, 1, &result)],
        };
        for verdict in &job_verdicts {
            verdict.print();
        }
        verdicts.append(&mut job_verdicts);
    }
    let identical = outcome::compare_digests(
        "engine_np3",
        "engine_np3_no_cache_no_fusion_funneled",
        &digests,
    );
    identical.print();
    verdicts.push(identical);

    let failed = verdicts.iter().filter(|v| v.failure.is_some()).count();
    let passed = verdicts.len() - failed;
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; finished in {:.2}s",
        if failed == 0 { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One rank of a job.
fn rank_main(role: Role) -> ExitCode {
    let config = match kolo::Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("KOLO_* settings: {e}");
            return ExitCode::FAILURE;
        }
    };
    let kolo = match Kolo::init_mpi(config) {
        Ok(kolo) => kolo,
        Err(e) => {
            eprintln!("Kolo::init_mpi: {e}");
            return ExitCode::FAILURE;
        }
    };
    match role {
        Role::Suite => engine::cases::run_all(&kolo),
        Role::FailPanic => engine::failure::train(&kolo, engine::failure::Fault::Panic),
        Role::FailExit => engine::failure::train(&kolo, engine::failure::Fault::Exit),
    }
}
