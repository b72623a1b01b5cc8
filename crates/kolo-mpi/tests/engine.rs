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

use engine::outcome;
use kolo::Kolo;
use kolo_mpi::launcher::{self, Job, Verdict};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

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

/// The jobs: the suite at 2, 3 and 4 processes with the default settings
/// (and a timeline), the suite at 3 processes with the response cache and
/// fusion off and `KOLO_MPI_THREADS_DISABLE=1`, and the two failures. Each
/// job's first two arguments are `--role NAME`.
fn jobs(dir: &Path) -> Vec<Job> {
    let job = |name: String, np: usize, role: Role| {
        let job = Job::new(name, np)
            .arg("--role")
            .arg(role.name())
            .timeout(JOB_TIMEOUT);
        common_env()
            .into_iter()
            .fold(job, |job, (k, v)| job.env(k, v))
    };
    let mut jobs: Vec<Job> = [2, 3, 4]
        .into_iter()
        .map(|np| {
            job(format!("engine_np{np}"), np, Role::Suite).env(
                "KOLO_TIMELINE",
                timeline_path(dir, np).display().to_string(),
            )
        })
        .collect();
    jobs.push(
        job(
            "engine_np3_no_cache_no_fusion_funneled".into(),
            3,
            Role::Suite,
        )
        .env("KOLO_CACHE_CAPACITY", "0")
        .env("KOLO_FUSION_THRESHOLD", "0")
        .env("KOLO_MPI_THREADS_DISABLE", "1"),
    );
    jobs.push(job("rank1_panics_np3".into(), 3, Role::FailPanic));
    jobs.push(job("rank1_exits_np2".into(), 2, Role::FailExit));
    jobs
}

fn timeline_path(dir: &Path, np: usize) -> std::path::PathBuf {
    dir.join(format!("timeline-np{np}.json"))
}

/// Settings every job shares: a short cycle (idle ranks answer quickly)
/// and OpenMPI yielding the CPU while it waits (4 busy-polling processes on
/// 2 cores would starve each other).
fn common_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("KOLO_CYCLE_TIME", "1"),
        ("OMPI_MCA_mpi_yield_when_idle", "1"),
    ]
}

fn main() -> ExitCode {
    launcher::main_with(
        |args| match launcher::flag_value(args, "--role").map(Role::parse) {
            Some(Some(role)) => rank_main(role),
            Some(None) => Err(format!("unknown --role in {args:?}")),
            // Started by mpirun without a role: not one of our jobs.
            None => Err("engine test: run it through cargo test, not mpirun".into()),
        },
        harness,
    )
}

/// The parent: runs every job and judges each of its cases.
fn harness(exe: &Path) -> Vec<Verdict> {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            let why = format!("cannot create a temporary directory: {e}");
            return vec![Verdict::new("engine_setup", Some(why))];
        }
    };
    let jobs = jobs(dir.path());
    let mut digests = Vec::new();
    let mut verdicts = launcher::run_jobs(exe, &jobs, |job, result| {
        if job.args.iter().all(|a| a != Role::Suite.name()) {
            return vec![outcome::failure(&job.name, 1, result)];
        }
        let mut v = outcome::suite(&job.name, job.np, result);
        if let Ok(output) = result.as_ref() {
            digests.push((job.name.clone(), job.np, outcome::digests(output)));
        }
        if job.env.iter().any(|(k, _)| k == "KOLO_TIMELINE") {
            v.push(engine::timeline::check(
                &job.name,
                &timeline_path(dir.path(), job.np),
                job.np,
            ));
        }
        v
    });
    let identical = outcome::compare_digests(
        "engine_np3",
        "engine_np3_no_cache_no_fusion_funneled",
        &digests,
    );
    identical.print();
    verdicts.push(identical);
    verdicts
}

/// One rank of a job.
fn rank_main(role: Role) -> Result<(), String> {
    let config = kolo::Config::from_env().map_err(|e| format!("KOLO_* settings: {e}"))?;
    let kolo = Kolo::init_mpi(config).map_err(|e| format!("Kolo::init_mpi: {e}"))?;
    let code = match role {
        Role::Suite => engine::cases::run_all(&kolo),
        Role::FailPanic => engine::failure::train(&kolo, engine::failure::Fault::Panic),
        Role::FailExit => engine::failure::train(&kolo, engine::failure::Fault::Exit),
    };
    if code == ExitCode::SUCCESS {
        Ok(())
    } else {
        Err(format!("role {} failed on this rank", role.name()))
    }
}
