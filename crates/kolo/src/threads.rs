//! Running n ranks as threads of this process, on kolo-threads' shared
//! memory backend: the embedded way to use kolo, and how its tests run.

use crate::config::Config;
use crate::engine::launch::open_timeline;
use crate::engine::watchdog::{Bulletin, Guards, MemoryBulletin};
use crate::error::Error;
use crate::kolo::Kolo;
use crate::panic_text::panic_text;
use crate::process_set::threads::{ThreadSetMaker, ThreadSets};
use kolo_threads::ThreadComm;
use kolo_timeline::Timeline;
use parking_lot::Mutex;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Runs `f` on `ranks` ranks, each a thread with its own [`Kolo`] engine
/// over kolo-threads, and returns every rank's result in rank order.
///
/// When a rank's `f` returns, its `Kolo` is dropped, which shuts down every
/// rank: operations still pending elsewhere fail with
/// [`Error::ShutDown`] naming it. When a rank's `f` panics or returns an
/// error, the rank aborts: peers' pending operations fail with
/// [`Error::RankFailed`] naming it instead of hanging. The error returned
/// is then the first failure in time (the cause, not its echoes on the
/// other ranks). [`run_all`] returns every rank's outcome instead, with
/// the closure's own error type.
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
    run_ranks(ranks, &config, start_on_threads, Sets::Make, f)
}

/// Starts one rank's engine on kolo-threads' backend (with rank 0's
/// timeline, opened before any rank started).
fn start_on_threads(
    comm: ThreadComm,
    config: &Config,
    timeline: Option<Timeline>,
    guards: Guards,
) -> Result<Kolo, Error> {
    Kolo::start_sharing(
        comm,
        config.clone(),
        |comm: &mut ThreadComm, message: &str| comm.fail(message),
        timeline,
        guards,
    )
}

/// Whether the ranks' engines make process sets (host engines do; a set
/// of GPU engines would need communicators of its own on the devices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sets {
    Make,
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    Refuse,
}

/// [`run`] with the engines started by `start` from each rank's
/// kolo-threads communicator (the GPU engines start theirs with NCCL).
pub(crate) fn run_ranks<R, F, S>(
    ranks: usize,
    config: &Config,
    start: S,
    sets: Sets,
    f: F,
) -> Result<Vec<R>, Error>
where
    R: Send,
    F: Fn(&Kolo) -> Result<R, Error> + Sync,
    S: Fn(ThreadComm, &Config, Option<Timeline>, Guards) -> Result<Kolo, Error> + Sync,
{
    let mut results = Vec::with_capacity(ranks);
    let mut failures = Vec::new();
    for (rank, outcome) in run_each(ranks, config, start, sets, f)?
        .into_iter()
        .enumerate()
    {
        match outcome {
            Ok(result) => results.push(result),
            Err((order, error)) => failures.push(Failure { order, rank, error }),
        }
    }
    match first_cause(failures) {
        Some(cause) => Err(cause),
        None => Ok(results),
    }
}

/// Runs `f` on `ranks` thread ranks as [`run`] does, and returns every
/// rank's own outcome, in rank order, with the closure's own error type:
/// kolo's errors (a rank that could not start, a panic, which fail as
/// [`Error::RankFailed`]) reach it through `From`. A rank whose `f` fails
/// aborts as in [`run`], so the others' outcomes show how that reached
/// them. The outer error is a run that could not begin: a setting out of
/// bounds, a timeline that cannot be created, no thread ranks.
///
/// ```
/// #[derive(Debug)]
/// enum MyError { Kolo(kolo::Error), Diverged(usize) }
/// impl From<kolo::Error> for MyError {
///     fn from(e: kolo::Error) -> Self { MyError::Kolo(e) }
/// }
/// impl std::fmt::Display for MyError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "{self:?}")
///     }
/// }
///
/// let outcomes = kolo::threads::run_all(2, kolo::Config::default(), |kolo| {
///     let mut loss = [1.0f32 + kolo.rank() as f32];
///     kolo.allreduce("loss", &mut loss, kolo::ReduceOp::Average)?;
///     if kolo.rank() == 1 {
///         return Err(MyError::Diverged(1));
///     }
///     Ok(loss[0])
/// })?;
/// assert_eq!(outcomes[0].as_ref().ok(), Some(&1.5));
/// assert!(matches!(outcomes[1], Err(MyError::Diverged(1))));
/// # Ok::<(), kolo::Error>(())
/// ```
pub fn run_all<R, E, F>(ranks: usize, config: Config, f: F) -> Result<Vec<Result<R, E>>, Error>
where
    R: Send,
    E: From<Error> + std::fmt::Display + Send,
    F: Fn(&Kolo) -> Result<R, E> + Sync,
{
    let outcomes = run_each(ranks, &config, start_on_threads, Sets::Make, f)?;
    Ok(outcomes
        .into_iter()
        .map(|outcome| outcome.map_err(|(_, error)| error))
        .collect())
}

/// Every rank's outcome, its failure stamped with the order in which the
/// ranks' closures failed (taken before the rank aborts, so a cause
/// precedes its echoes).
#[allow(clippy::type_complexity)]
fn run_each<R, E, F, S>(
    ranks: usize,
    config: &Config,
    start: S,
    sets: Sets,
    f: F,
) -> Result<Vec<Result<R, (u64, E)>>, Error>
where
    R: Send,
    E: From<Error> + std::fmt::Display + Send,
    F: Fn(&Kolo) -> Result<R, E> + Sync,
    S: Fn(ThreadComm, &Config, Option<Timeline>, Guards) -> Result<Kolo, Error> + Sync,
{
    // Settings out of bounds and a timeline that cannot be created fail
    // the run before any rank starts; rank 0's engine gets it open.
    config.validate()?;
    let timeline = Mutex::new(Some(open_timeline(config, 0)?));
    let comms = kolo_threads::communicators(ranks).map_err(|e| Error::Start {
        message: format!("cannot create {ranks} thread ranks: {e}"),
    })?;
    let clock = AtomicU64::new(0);
    let registry = Arc::new(ThreadSets::default());
    // The ranks' faults, where each one's watchdog reads the others'.
    let bulletin: Arc<dyn Bulletin> = Arc::new(MemoryBulletin::default());
    let outcomes = std::thread::scope(|scope| {
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (f, start, clock, timeline) = (&f, &start, &clock, &timeline);
                let maker = (sets == Sets::Make).then(|| {
                    Arc::new(ThreadSetMaker {
                        rank,
                        sets: Arc::clone(&registry),
                    })
                });
                let guards = Guards {
                    interrupt: None,
                    bulletin: Some(Arc::clone(&bulletin)),
                };
                std::thread::Builder::new()
                    .name(format!("kolo-user-{rank}"))
                    .spawn_scoped(scope, move || {
                        let timeline = if rank == 0 {
                            timeline.lock().take()
                        } else {
                            None
                        };
                        let kolo = start(comm, config, timeline, guards).map(|kolo| match maker {
                            Some(maker) => kolo.making_sets(maker),
                            None => kolo,
                        });
                        run_rank(rank, kolo, f, clock)
                    })
                    .map_err(|e| (rank, e))
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| match thread {
                Ok(handle) => handle.join().unwrap_or_else(|panic| {
                    // `run_rank` catches the closure's panics; this is kolo's own.
                    let message =
                        format!("a rank's thread panicked: {}", panic_text(panic.as_ref()));
                    Err((u64::MAX, E::from(panicked(&message))))
                }),
                Err((rank, e)) => Err((
                    clock.fetch_add(1, Ordering::SeqCst),
                    E::from(Error::Start {
                        message: format!("cannot spawn the thread of rank {rank}: {e}"),
                    }),
                )),
            })
            .collect()
    });
    Ok(outcomes)
}

/// One rank: take the started engine, run `f`, abort on failure, shut down. A
/// failure comes with its stamp from `clock`.
fn run_rank<R, E: From<Error> + std::fmt::Display>(
    rank: usize,
    started: Result<Kolo, Error>,
    f: &(impl Fn(&Kolo) -> Result<R, E> + Sync),
    clock: &AtomicU64,
) -> Result<R, (u64, E)> {
    let stamp = || clock.fetch_add(1, Ordering::SeqCst);
    let kolo = started.map_err(|e| (stamp(), E::from(e)))?;
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
            Err((order, E::from(Error::RankFailed { rank, message })))
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

/// The communicator of a job of one rank (a process started alone).
pub(crate) fn lone_comm() -> Result<ThreadComm, Error> {
    kolo_threads::communicators(1)
        .ok()
        .and_then(|mut comms| comms.pop())
        .ok_or_else(|| Error::Start {
            message: "cannot make a one-rank kolo-threads communicator".into(),
        })
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
