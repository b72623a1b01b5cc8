//! One rank of a fault job: its engine over UCX (`Kolo::init_ucx`), a
//! short training loop of large allreduces, and — on the rank the case
//! takes away — a SIGKILL of itself at the case's phase. A survivor checks
//! how its calls fail and prints one `kolo-fault` line saying so; any
//! other outcome is an error (exit 1), a panic exits 101.

use crate::cases::{names_rank, Case, Fault, Phase, DURING_STEP};
use kolo::{Config, Error, Kolo, ReduceOp};
use std::time::{Duration, Instant};

/// How long a survivor's failing call (or a start that cannot reach the
/// store) may take before the case fails.
pub const DETECTION_BOUND: Duration = Duration::from_secs(30);
/// Allreduces in flight per step.
const TENSORS: usize = 2;
/// Elements per tensor in the step the killed rank dies in (4 MiB of
/// f32), and in the others (64 KiB: quick on 4 processes and 2 cores).
const LARGE: usize = 1 << 20;
const SMALL: usize = 1 << 14;

/// The line that tells the harness this process's id (its process group:
/// `kolo_run::run_captured` starts each rank as a group's leader).
pub const PID_LINE: &str = "kolo-fault-pid";
/// The start of a survivor's report.
pub const REPORT_LINE: &str = "kolo-fault survivor";

/// Runs this process's rank of `case`.
pub fn main(case: &Case, rank: usize) -> Result<(), String> {
    println!("{PID_LINE} {}", std::process::id());
    match case.fault {
        Fault::StoreGoneAtStart if rank == 0 => Ok(()),
        Fault::StoreGoneAtStart => start_without_the_store(rank),
        Fault::Killed {
            phase,
            rank: killed,
        } if rank == killed => {
            let kolo = start()?;
            Err(die_at(&kolo, phase))
        }
        Fault::Killed {
            phase,
            rank: killed,
        } => survive(case, phase, killed),
    }
}

fn start() -> Result<Kolo, String> {
    let config = Config::from_env().map_err(|e| format!("KOLO_* settings: {e}"))?;
    Kolo::init_ucx(config).map_err(|e| format!("Kolo::init_ucx: {e}"))
}

/// Elements per tensor of `step`.
fn elements(step: usize) -> usize {
    if step == DURING_STEP {
        LARGE
    } else {
        SMALL
    }
}

/// One training step: [`TENSORS`] allreduces (sums of `rank + 1`) in
/// flight at once, each result checked. `before_waiting` runs once they
/// are submitted.
fn step(kolo: &Kolo, step: usize, before_waiting: impl FnOnce()) -> Result<(), Error> {
    let n = kolo.size();
    let mut grads: Vec<Vec<f32>> = (0..TENSORS)
        .map(|_| vec![(kolo.rank() + 1) as f32; elements(step)])
        .collect();
    kolo.scope(|s| {
        let handles = grads
            .iter_mut()
            .enumerate()
            .map(|(t, g)| s.allreduce_async(&format!("step{step}/grad{t}"), g, ReduceOp::Sum))
            .collect::<Result<Vec<_>, _>>()?;
        before_waiting();
        handles.into_iter().try_for_each(|h| h.wait())
    })?;
    let want = (n * (n + 1) / 2) as f32;
    if let Some(t) = grads.iter().position(|g| g.iter().any(|&x| x != want)) {
        // A wrong sum is no fault this test injects: the case fails.
        panic!("step {step}: tensor {t} does not hold {want}");
    }
    Ok(())
}

/// Kills this process with SIGKILL (a crash that runs no handler and
/// closes every connection at once).
fn kill_self() -> String {
    let pid = std::process::id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status();
    // The signal is delivered at once; the sleep only bounds a kill that
    // did not happen.
    std::thread::sleep(Duration::from_secs(10));
    format!("still running after `kill -9 {pid}` ({status:?})")
}

/// The killed rank: trains up to its phase, then dies. Returns only if
/// it did not die (an error).
fn die_at(kolo: &Kolo, phase: Phase) -> String {
    for s in 0..phase.steps_completed() {
        if let Err(e) = step(kolo, s, || {}) {
            return format!("step {s} failed before this rank was killed: {e}");
        }
    }
    if phase != Phase::During {
        return kill_self();
    }
    // Submitted, not waited for: the step's allreduces are in flight on
    // every rank when the signal lands.
    let mut still_alive = String::new();
    let outcome = step(kolo, DURING_STEP, || still_alive = kill_self());
    format!("{still_alive} (step {DURING_STEP}: {outcome:?})")
}

/// A survivor: trains until a step fails, which must happen by the first
/// step the killed rank never submitted, within [`DETECTION_BOUND`], with
/// an error naming the killed rank; the next call must fail the same way.
fn survive(case: &Case, phase: Phase, killed: usize) -> Result<(), String> {
    let kolo = start()?;
    let rank = kolo.rank();
    let last = phase.first_step_never_submitted();
    for s in 0..=last {
        let started = Instant::now();
        let Err(err) = step(&kolo, s, || {}) else {
            continue;
        };
        let waited = started.elapsed();
        let earliest = phase.earliest_failing_step();
        if s < earliest {
            return Err(format!(
                "{case}: step {s} failed, but rank {killed} completed step {earliest}: {err}"
            ));
        }
        check_names(&err, killed).map_err(|why| format!("{case}: step {s}: {why}"))?;
        if waited > DETECTION_BOUND {
            return Err(format!("{case}: step {s} took {waited:?} to fail: {err}"));
        }
        let then = match kolo.barrier() {
            Ok(()) => return Err(format!("{case}: a barrier after the failure succeeded")),
            Err(e) => e,
        };
        check_names(&then, killed).map_err(|why| {
            format!("{case}: the call after step {s} (which failed with {err:?}): {why}")
        })?;
        println!(
            "{REPORT_LINE} {rank}: step {s} failed after {waited:.1?}: {err:?} \
             | the next call: {then}"
        );
        return Ok(());
    }
    Err(format!(
        "{case}: steps 0..={last} all succeeded though rank {killed} was killed"
    ))
}

/// `err` is `Error::RankFailed` naming `killed`, or its text names it.
fn check_names(err: &Error, killed: usize) -> Result<(), String> {
    match err {
        Error::RankFailed { rank, .. } if *rank == killed => Ok(()),
        _ if names_rank(&err.to_string(), killed) => Ok(()),
        _ => Err(format!("the error does not name rank {killed}: {err:?}")),
    }
}

/// A rank whose store never comes up (rank 0 left at once): its start
/// must fail within its bound, naming the store's address.
fn start_without_the_store(rank: usize) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let address = format!("{}:{}", var("MASTER_ADDR"), var("MASTER_PORT"));
    let started = Instant::now();
    let err = match start() {
        Ok(_) => return Err("Kolo::init_ucx started without the store's host".into()),
        Err(e) => e,
    };
    let waited = started.elapsed();
    if !err.contains(&address) {
        return Err(format!("the start's error does not name {address}: {err}"));
    }
    if waited > DETECTION_BOUND {
        return Err(format!("the start took {waited:?} to fail: {err}"));
    }
    println!("{REPORT_LINE} {rank}: the start failed after {waited:.1?}: {err}");
    Ok(())
}
