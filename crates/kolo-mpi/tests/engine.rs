//! The engine suite (`tests/engine-suite`, the same cases kolo's threads
//! tests run) over MPI under a real `mpirun`, plus MPI's own: the thread
//! level, and a rank that fails mid-training by panicking, by exiting or
//! by being killed with SIGKILL (`engine_killed`).
//!
//! `cargo test` runs this binary directly (it is `harness = false`); it then
//! starts a job of itself under `mpirun` per suite job (see [`suite_jobs`])
//! and per failure, where each process is one rank with its own engine
//! (`Kolo::init_mpi`). Every rank runs the job's cases and prints a
//! `kolo-case NAME RANK ok` line per case; a rank whose case fails prints
//! why and aborts the job (so no peer is left waiting). This process then
//! judges each case of each job, libtest style.

mod engine_killed;

use kolo::{Config, Error, Kolo};
use kolo_engine_suite::{
    compare_digests, failure, judge, main_cases, panic_text, run_rank, Case, CaseLine, Digest,
};
use kolo_mpi::launcher::{self, streams, Job, Verdict};
use kolo_mpi::ThreadLevel;
use std::collections::HashMap;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// The longest a job may take before it counts as hung (generous: CI
/// oversubscribes 4 processes on 2 cores).
const JOB_TIMEOUT: Duration = Duration::from_secs(300);

/// MPI's own case, run before the main sequence's final shutdown.
const THREAD_LEVEL: Case = Case::new("thread_level", thread_level);

/// The suite's jobs over MPI: the main sequence at 2, 3 and 4 processes
/// (with a timeline), at 3 with the response cache and fusion off and MPI
/// initialised `FUNNELED` (its results must equal the defaults'), and the
/// stall inspector at 3.
fn suite_jobs() -> Vec<kolo_engine_suite::Job> {
    let mut jobs: Vec<_> = [2, 3, 4]
        .into_iter()
        .map(|np| kolo_engine_suite::Job::main(np, &[THREAD_LEVEL]))
        .collect();
    jobs.push(
        kolo_engine_suite::Job::new(VARIANT, 3, main_cases(&[THREAD_LEVEL])).with_settings(
            |config| {
                let mut config = config.cache_capacity(0).fusion_threshold(0);
                config.mpi_threads_disable = true;
                config
            },
        ),
    );
    jobs.push(kolo_engine_suite::Job::stall(3));
    jobs.extend(kolo_engine_suite::order_jobs(&ORDER_RANKS));
    jobs
}

/// The process counts of the order jobs (every submission style against
/// every other, under each setting of fusion, cache and timeline).
const ORDER_RANKS: [usize; 3] = [2, 3, 4];

/// Whether the backend packs fused allreduces into the fusion buffer (see
/// `judge`): MPI does (no native allreduce over segments).
const PACKS: bool = true;

/// The job whose results must equal `main_np3`'s.
const VARIANT: &str = "main_np3_no_cache_no_fusion_funneled";

/// How rank 1 fails in a failure job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Panic,
    Exit,
}

/// The failure jobs: (name, processes, fault).
const FAILURES: [(&str, usize, Fault); 2] = [
    ("rank1_panics_np3", 3, Fault::Panic),
    ("rank1_exits_np2", 2, Fault::Exit),
];

fn main() -> std::process::ExitCode {
    launcher::main_with(rank_main, harness)
}

/// Settings every job shares: a short cycle (idle ranks answer quickly)
/// and OpenMPI yielding the CPU while it waits (4 busy-polling processes on
/// 2 cores would starve each other).
fn launcher_job(name: &str, np: usize) -> Job {
    Job::new(name, np)
        .timeout(JOB_TIMEOUT)
        .env("KOLO_CYCLE_TIME", "1")
        .env("OMPI_MCA_mpi_yield_when_idle", "1")
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
    let suite = suite_jobs();
    let dir_arg = dir.path().display().to_string();
    let mut jobs: Vec<Job> = suite
        .iter()
        .map(|job| {
            launcher_job(&job.name, job.ranks).args([
                "--job",
                job.name.as_str(),
                "--dir",
                dir_arg.as_str(),
            ])
        })
        .collect();
    for (name, np, fault) in FAILURES {
        jobs.push(launcher_job(name, np).args(["--fail", &format!("{fault:?}")]));
    }
    // MPMD: one rank of kolo beside a process that exits 0 without ever
    // initialising MPI (`mpirun -np 1 kolo : -np 1 /bin/true`).
    jobs.push(
        launcher_job(NEVER_INITIALISED, 1)
            .env("KOLO_START_TIMEOUT", "3")
            .args(["--start", ":", "-np", "1", "/bin/true"]),
    );
    // A rank SIGKILLed mid-collective at 2, 3 and 4 processes.
    jobs.extend(engine_killed::jobs(launcher_job, &dir_arg));
    let mut lines: HashMap<String, Vec<CaseLine>> = HashMap::new();
    let mut verdicts = launcher::run_jobs(exe, &jobs, |job, result| {
        if job.name == NEVER_INITIALISED {
            return vec![start_bound_verdict(result)];
        }
        if engine_killed::is_mine(job) {
            return engine_killed::verdicts(job, result, dir.path());
        }
        let Some(suite_job) = suite.iter().find(|s| s.name == job.name) else {
            return vec![failure_verdict(&job.name, 1, result)];
        };
        let output = match result {
            Ok(output) => output,
            Err(why) => {
                return vec![Verdict::new(
                    format!("{}::mpirun", job.name),
                    Some(why.clone()),
                )]
            }
        };
        let job_lines: Vec<CaseLine> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(CaseLine::parse)
            .collect();
        let mut v: Vec<Verdict> = judge(suite_job, &job_lines, dir.path(), PACKS)
            .into_iter()
            .map(|s| {
                Verdict::new(
                    s.name,
                    s.failure.map(|why| format!("{why}\n{}", streams(output))),
                )
            })
            .collect();
        let exit = (!output.status.success())
            .then(|| format!("the job ended with {}\n{}", output.status, streams(output)));
        v.push(Verdict::new(
            format!("{}::every_process_exits_0", job.name),
            exit,
        ));
        lines.insert(job.name.clone(), job_lines);
        v
    });
    let empty = Vec::new();
    let of = |name: &str| lines.get(name).unwrap_or(&empty).as_slice();
    let identical = compare_digests(("main_np3", of("main_np3")), (VARIANT, of(VARIANT)));
    let identical = Verdict::new(identical.name, identical.failure);
    identical.print();
    verdicts.push(identical);
    // Each order job reaches the bits of the first at its process count.
    for job in suite.iter().filter(|j| j.name.starts_with("orders_")) {
        let Some(first) = suite
            .iter()
            .find(|j| j.name.starts_with("orders_") && j.ranks == job.ranks)
        else {
            continue;
        };
        if first.name != job.name {
            let same = compare_digests((&first.name, of(&first.name)), (&job.name, of(&job.name)));
            let same = Verdict::new(same.name, same.failure);
            same.print();
            verdicts.push(same);
        }
    }
    verdicts
}

/// The job of a peer that never initialises MPI.
const NEVER_INITIALISED: &str = "peer_never_initialises_mpi";

/// Its verdict: the kolo rank's start fails (KOLO_START_TIMEOUT) instead
/// of hanging in `MPI_Init`, and `mpirun` exits non-zero.
fn start_bound_verdict(result: &Result<Output, String>) -> Verdict {
    let name = format!("{NEVER_INITIALISED}::the_start_fails_within_its_bound");
    let failure = match result {
        Err(why) => Some(why.clone()),
        Ok(output) if output.status.success() => {
            Some(format!("mpirun exited 0\n{}", streams(output)))
        }
        Ok(output) if !streams(output).contains("KOLO_START_TIMEOUT") => Some(format!(
            "the output does not name KOLO_START_TIMEOUT\n{}",
            streams(output)
        )),
        Ok(_) => None,
    };
    Verdict::new(name, failure)
}

/// The verdict of a failure job: `mpirun` must exit non-zero (before the
/// harness's timeout) and the output must name the failed rank.
fn failure_verdict(job: &str, rank: usize, result: &Result<Output, String>) -> Verdict {
    let name = format!("{job}::the_job_ends_naming_rank_{rank}");
    let failure = match result {
        Err(why) => Some(why.clone()),
        Ok(output) if output.status.success() => Some(format!(
            "mpirun exited 0 although rank {rank} failed\n{}",
            streams(output)
        )),
        Ok(output) if !streams(output).contains(&format!("rank {rank}")) => Some(format!(
            "the output does not name rank {rank}\n{}",
            streams(output)
        )),
        Ok(_) => None,
    };
    Verdict::new(name, failure)
}

/// One rank of a job: `--job NAME --dir DIR` (a suite job), `--fail
/// Panic|Exit` (a failure job), `--kill RANK` (a rank SIGKILLed, see
/// `engine_killed`) or `--start` (beside a peer that never initialises
/// MPI).
fn rank_main(args: &[String]) -> Result<(), String> {
    let config = Config::from_env().map_err(|e| format!("KOLO_* settings: {e}"))?;
    if args.iter().any(|a| a == "--start") {
        // A peer that never initialises MPI: the start must fail.
        return match Kolo::init_mpi(config) {
            Ok(_) => Err("Kolo::init_mpi started without its peer".into()),
            Err(e) => Err(format!("Kolo::init_mpi: {e}")),
        };
    }
    if args.iter().any(|a| a == "--kill") {
        return engine_killed::rank_main(config, args);
    }
    if let Some(fault) = launcher::flag_value(args, "--fail") {
        let fault = match fault {
            "Panic" => Fault::Panic,
            "Exit" => Fault::Exit,
            other => return Err(format!("unknown --fail {other}")),
        };
        let kolo = Kolo::init_mpi(config).map_err(|e| format!("Kolo::init_mpi: {e}"))?;
        return train_and_fail(&kolo, fault);
    }
    let (Some(name), Some(dir)) = (
        launcher::flag_value(args, "--job"),
        launcher::flag_value(args, "--dir"),
    ) else {
        return Err("engine test: run it through cargo test, not mpirun".into());
    };
    let jobs = suite_jobs();
    let job = jobs
        .iter()
        .find(|j| j.name == name)
        .ok_or_else(|| format!("unknown --job {name}"))?;
    let config = job.configure(config, Path::new(dir));
    let kolo = Kolo::init_mpi(config).map_err(|e| format!("Kolo::init_mpi: {e}"))?;
    let outcome = run_rank(&kolo, &job.cases, &mut |line| {
        // One line, flushed at once (the job may be aborted next).
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    });
    if let Err(why) = &outcome {
        // `Kolo::abort` ends the job with `MPI_Abort`, so that peers that
        // wait on this rank do not hang.
        kolo.abort(why);
    }
    outcome
}

/// The suite's training loop with rank 1 failing at its step. A panic is
/// caught and the rank calls `Kolo::abort`, whose MPI hook prints a message
/// naming the rank and calls `MPI_Abort`: `mpirun` kills the others and
/// exits non-zero. An exit skips `MPI_Finalize`, as a crash or an `exit`
/// deep in user code would: `mpirun` notices and ends the job.
fn train_and_fail(kolo: &Kolo, fault: Fault) -> Result<(), String> {
    let rank = kolo.rank();
    let fail = |step: usize| match fault {
        Fault::Panic => panic!("injected failure at step {step}"),
        Fault::Exit => {
            eprintln!("rank {rank}: exiting at step {step} without finalising MPI");
            std::process::exit(3);
        }
    };
    let why = match catch_unwind(AssertUnwindSafe(|| failure::train(kolo, fail))) {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => format!("rank {rank} failed: {e}"),
        Err(panic) => format!("rank {rank} panicked: {}", panic_text(panic.as_ref())),
    };
    kolo.abort(&why);
    Err(why)
}

/// `Kolo::mpi_threads_supported` reports what MPI granted, and
/// `mpi_threads_disable` asks for (and gets) no more than
/// `MPI_THREAD_FUNNELED`; the other cases ran at that level.
fn thread_level(kolo: &Kolo) -> Result<Digest, Error> {
    let granted = kolo_mpi::granted_thread_level().ok_or_else(|| Error::InvalidArgument {
        tensor: "thread level".into(),
        reason: "MPI reports no granted thread level although kolo initialised it".into(),
    })?;
    assert_eq!(
        Kolo::mpi_threads_supported(),
        Some(granted == ThreadLevel::Multiple),
        "granted {granted:?}"
    );
    if kolo.config().mpi_threads_disable {
        assert!(granted <= ThreadLevel::Funneled, "granted {granted:?}");
    }
    Ok(None)
}
