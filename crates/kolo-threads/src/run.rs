//! [`run`]: n ranks as scoped threads, with failures propagated to peers.

use crate::comm::ThreadComm;
use crate::communicators;
use crate::error::{RankFailure, RunError};
use parking_lot::Mutex;
use std::any::Any;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::thread;

/// Runs `f` on `n` ranks, each on its own scoped thread with its own
/// [`ThreadComm`], and returns their results in rank order.
///
/// A rank whose `f` returns an error or panics is marked failed, so every
/// peer blocked on it (in a collective or a `recv`) fails promptly with
/// `TransportError::PeerFailed` naming it, instead of hanging; the error
/// then lists every failed rank, root cause first. A rank that returns
/// `Ok` leaves the communicator. `run(0, f)` runs nothing and returns an
/// empty vector.
pub fn run<R, E, F>(n: usize, f: F) -> Result<Vec<R>, RunError>
where
    R: Send,
    E: fmt::Display,
    F: Fn(&mut ThreadComm) -> Result<R, E> + Sync,
{
    let Ok(comms) = communicators(n) else {
        return Ok(Vec::new());
    };
    let comms: Vec<Mutex<Option<ThreadComm>>> =
        comms.into_iter().map(|c| Mutex::new(Some(c))).collect();
    let outcomes: Vec<Result<R, (RankFailure, bool)>> = thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(rank, slot)| {
                let f = &f;
                let spawned = thread::Builder::new()
                    .name(format!("kolo-rank-{rank}"))
                    .spawn_scoped(scope, move || match slot.lock().take() {
                        Some(mut comm) => run_rank(&mut comm, f),
                        None => Err(not_started(rank, "its communicator was gone".into())),
                    });
                spawned.map_err(|err| {
                    let message = format!("could not start its thread: {err}");
                    if let Some(comm) = slot.lock().take() {
                        comm.fail(message.clone());
                    }
                    not_started(rank, message)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, handle)| {
                handle?.join().unwrap_or_else(|payload| {
                    Err((
                        RankFailure {
                            rank,
                            message: panic_message(payload.as_ref()),
                            panicked: true,
                        },
                        false,
                    ))
                })
            })
            .collect()
    });
    let mut values = Vec::with_capacity(n);
    let mut failures = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(value) => values.push(value),
            Err(failure) => failures.push(failure),
        }
    }
    if failures.is_empty() {
        Ok(values)
    } else {
        Err(RunError::from_outcomes(failures))
    }
}

fn not_started(rank: usize, message: String) -> (RankFailure, bool) {
    (
        RankFailure {
            rank,
            message,
            panicked: false,
        },
        false,
    )
}

/// Runs `f` for one rank; on failure marks the rank failed (before its
/// communicator is dropped) and says whether the failure followed a peer's.
fn run_rank<R, E, F>(comm: &mut ThreadComm, f: &F) -> Result<R, (RankFailure, bool)>
where
    E: fmt::Display,
    F: Fn(&mut ThreadComm) -> Result<R, E>,
{
    let (message, panicked) = match panic::catch_unwind(AssertUnwindSafe(|| f(comm))) {
        Ok(Ok(value)) => return Ok(value),
        Ok(Err(err)) => (err.to_string(), false),
        Err(payload) => (panic_message(payload.as_ref()), true),
    };
    if panicked {
        comm.fail(format!("panicked: {message}"));
    } else {
        comm.fail(message.clone());
    }
    let failure = RankFailure {
        rank: comm.rank,
        message,
        panicked,
    };
    Err((failure, comm.followed_peer()))
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}
