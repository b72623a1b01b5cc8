//! Running n ranks as threads of this process, on kolo-threads' shared
//! memory backend: the embedded way to use kolo, and how its tests run.

use crate::config::Config;
use crate::engine::launch::open_timeline;
use crate::error::Error;
use crate::kolo::Kolo;
use crate::panic_text::panic_text;
use kolo_threads::ThreadComm;
use kolo_timeline::Timeline;
use parking_lot::Mutex;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

/// Runs `f` on `ranks` ranks, each a thread with its own [`Kolo`] engine
/// over kolo-threads, and returns every rank's result in rank order.
///
/// When a rank's `f` returns, its `Kolo` is dropped, which shuts down every
/// rank: operations still pending elsewhere fail with
/// [`Error::ShutDown`] naming it. When a rank's `f` panics or returns an
/// error, the rank aborts: peers' pending operations fail with
/// [`Error::RankFailed`] naming it instead of hanging. The error returned
/// is then the first failure in time (the cause, not its echoes on the
/// other ranks).
///
/// ```
/// let sums = kolo::threads::run(2, kolo::Config::default(), |kolo| {
///     let mut x = [kolo.rank() as i32 + 1; 3];
///     kolo.allreduce("x", &mut x, kolo::ReduceOp::Sum)?;
///     Ok(x)
/// })?;
/// assert_eq!(sums, [[3, 3, 3], [3, 3, 3]]);
/// # Ok::<(), kolo::Error>(())
/// ```
pub fn run<R, F>(ranks: usize, config: Config, f: F) -> Result<Vec<R>, Error>
where
    R: Send,
    F: Fn(&Kolo) -> Result<R, Error> + Sync,
{
    run_ranks(ranks, &config, start_on_threads, f)
}

/// Starts one rank's engine on kolo-threads' backend (with rank 0's
/// timeline, opened before any rank started).
fn start_on_threads(
    comm: ThreadComm,
    config: &Config,
    timeline: Option<Timeline>,
) -> Result<Kolo, Error> {
    Kolo::start_sharing(
        comm,
        config.clone(),
        |comm: &mut ThreadComm, message: &str| comm.fail(message),
        timeline,
    )
}

/// [`run`] with the engines started by `start` from each rank's
/// kolo-threads communicator (the GPU engines start theirs with NCCL).
pub(crate) fn run_ranks<R, F, S>(
    ranks: usize,
    config: &Config,
    start: S,
    f: F,
) -> Result<Vec<R>, Error>
where
    R: Send,
    F: Fn(&Kolo) -> Result<R, Error> + Sync,
    S: Fn(ThreadComm, &Config, Option<Timeline>) -> Result<Kolo, Error> + Sync,
{
    // Settings out of bounds and a timeline that cannot be created fail
    // the run before any rank starts; rank 0's engine gets it open.
    config.validate()?;
    let timeline = Mutex::new(Some(open_timeline(config, 0)?));
    let comms = kolo_threads::communicators(ranks).map_err(|e| Error::Start {
        message: format!("cannot create {ranks} thread ranks: {e}"),
    })?;
    // Failures stamped with the order in which the ranks' closures failed
    // (taken before the rank aborts, so a cause precedes its echoes).
    let failures: Mutex<Vec<Failure>> = Mutex::new(Vec::new());
    let clock = AtomicU64::new(0);
    let results: Vec<Option<R>> = std::thread::scope(|scope| {
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (f, start, failures, clock) = (&f, &start, &failures, &clock);
                let timeline = &timeline;
                std::thread::Builder::new()
                    .name(format!("kolo-user-{rank}"))
                    .spawn_scoped(scope, move || {
                        let timeline = if rank == 0 {
                            timeline.lock().take()
                        } else {
                            None
                        };
                        match run_rank(rank, start(comm, config, timeline), f, clock) {
                            Ok(result) => Some(result),
                            Err((order, error)) => {
                                failures.lock().push(Failure { order, rank, error });
                                None
                            }
                        }
                    })
                    .map_err(|e| (rank, e))
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| match thread {
                Ok(handle) => handle.join().unwrap_or_else(|panic| {
                    // `run_rank` catches the closure's panics; this is kolo's own.
                    failures.lock().push(Failure {
                        order: u64::MAX,
                        rank: usize::MAX,
                        error: panicked(&format!(
                            "a rank's thread panicked: {}",
                            panic_text(panic.as_ref())
                        )),
                    });
                    None
                }),
                Err((rank, e)) => {
                    failures.lock().push(Failure {
                        order: clock.fetch_add(1, Ordering::SeqCst),
                        rank,
                        error: Error::Start {
                            message: format!("cannot spawn the thread of rank {rank}: {e}"),
                        },
                    });
                    None
                }
            })
            .collect()
    });
    if let Some(cause) = first_cause(failures.into_inner()) {
        return Err(cause);
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| panicked("a rank ended without a result")))
        .collect()
}

/// One rank: take the started engine, run `f`, abort on failure, shut down. A
/// failure comes with its stamp from `clock`.
fn run_rank<R>(
    rank: usize,
    started: Result<Kolo, Error>,
    f: &(impl Fn(&Kolo) -> Result<R, Error> + Sync),
    clock: &AtomicU64,
) -> Result<R, (u64, Error)> {
    let stamp = || clock.fetch_add(1, Ordering::SeqCst);
    let kolo = started.map_err(|e| (stamp(), e))?;
    let outcome = match catch_unwind(AssertUnwindSafe(|| f(&kolo))) {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(error)) => {
            let order = stamp();
            kolo.abort(&format!("rank {rank} returned an error: {error}"));
            Err((order, error))
        }
        Err(payload) => {
            let order = stamp();
            let message = format!("rank {rank} panicked: {}", panic_text(payload.as_ref()));
            kolo.abort(&message);
            Err((order, Error::RankFailed { rank, message }))
        }
    };
    drop(kolo);
    outcome
}

/// One rank's failure: when (a stamp of the shared clock), which rank
/// recorded it, and the error.
#[derive(Debug)]
struct Failure {
    order: u64,
    rank: usize,
    error: Error,
}

/// The cause among the ranks' failures: the first in time that is not an
/// echo. A rank's report that another rank failed (`RankFailed` naming a
/// rank that recorded a failure of its own) is an echo of that rank's
/// failure, whichever came first in time: the failed rank may record its
/// own failure only after its peers saw it leave. With only echoes, the
/// first in time.
fn first_cause(mut failures: Vec<Failure>) -> Option<Error> {
    failures.sort_by_key(|f| f.order);
    let failed: Vec<usize> = failures.iter().map(|f| f.rank).collect();
    let echo = |f: &Failure| matches!(&f.error, Error::RankFailed { rank, .. } if *rank != f.rank && failed.contains(rank));
    let at = failures.iter().position(|f| !echo(f)).unwrap_or(0);
    (at < failures.len()).then(|| failures.swap_remove(at).error)
}

fn panicked(message: &str) -> Error {
    Error::Start {
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(order: u64, rank: usize, error: Error) -> Failure {
        Failure { order, rank, error }
    }

    fn left(rank: usize) -> Error {
        Error::RankFailed {
            rank,
            message: format!("rank {rank} left the communicator"),
        }
    }

    #[test]
    fn the_cause_wins_over_its_echoes_whenever_it_came() {
        let cause = Error::Start {
            message: "the cause".into(),
        };
        // Rank 1 saw rank 0 leave before rank 0 recorded why.
        let got = first_cause(vec![failure(0, 1, left(0)), failure(1, 0, cause.clone())]);
        assert_eq!(got, Some(cause.clone()));
        // An echo of a rank that recorded nothing is all there is.
        assert_eq!(first_cause(vec![failure(3, 1, left(2))]), Some(left(2)));
        // Two causes: the first in time.
        let other = Error::Start {
            message: "later".into(),
        };
        let got = first_cause(vec![failure(9, 2, other), failure(4, 0, cause.clone())]);
        assert_eq!(got, Some(cause));
        // A rank's own failure naming itself is a cause, not an echo.
        assert_eq!(first_cause(vec![failure(1, 2, left(2))]), Some(left(2)));
        assert_eq!(first_cause(Vec::new()), None);
    }
}
