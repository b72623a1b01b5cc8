//! What the GPU binaries (`gpu_nccl`, threads; `gpu_nccl_mpi`, processes)
//! share: a check's outcome, its `PASS` / `SKIP` / `FAIL` line, and the
//! watchdog that turns a hung check into a `FAIL` and the end of the
//! process (its threads cannot be stopped; under `mpirun` the job ends).

use std::time::{Duration, Instant};

/// What one check gives: passed (a note), skipped (why), or failed (why).
pub enum Outcome {
    Pass(String),
    Skip(String),
    Fail(String),
}

/// NVLink multicast (NVLS) off unless the caller chose: every channel is
/// a communicator of its own, and NVLS would reserve multicast memory for
/// each (kolo-nccl's run.sh sets the same). Call before any thread exists.
pub fn nvls_off() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
}

/// Prints `name`'s line for `outcome`, which took `elapsed`.
pub fn print(name: &str, outcome: &Outcome, started: Instant) {
    match outcome {
        Outcome::Pass(note) => println!(
            "PASS {name} ({:.1} s){note}",
            started.elapsed().as_secs_f64()
        ),
        Outcome::Skip(why) => println!("SKIP {name}: {why}"),
        Outcome::Fail(why) => println!("FAIL {name}: {why}"),
    }
}

/// Runs `check` on a thread of its own; one that outlives `limit` prints
/// a `FAIL` line and ends the process at once.
pub fn bounded<'a>(
    name: &str,
    limit: Duration,
    check: impl FnOnce() -> Outcome + Send + 'a,
) -> Outcome {
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("gpu-check".into())
            .spawn_scoped(s, move || {
                let _ = tx.send(check());
            });
        let handle = match spawned {
            Ok(handle) => handle,
            Err(e) => return Outcome::Fail(format!("cannot start the check's thread: {e}")),
        };
        match rx.recv_timeout(limit) {
            Ok(outcome) => {
                let _ = handle.join();
                outcome
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                println!("FAIL {name}: hung for {limit:?}; ending");
                std::process::exit(1);
            }
            Err(e) => match handle.join() {
                Err(_) => Outcome::Fail("the check panicked".into()),
                Ok(()) => Outcome::Fail(format!("the check ended without a result: {e}")),
            },
        }
    })
}
