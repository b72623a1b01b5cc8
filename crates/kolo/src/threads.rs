//! Running n ranks as threads of this process, on kolo-threads' shared
//! memory backend: the embedded way to use kolo, and how its tests run.

use crate::config::Config;
use crate::engine::Kolo;
use crate::error::Error;
use kolo_threads::ThreadComm;
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

/// Starts one rank's engine on kolo-threads' backend.
fn start_on_threads(comm: ThreadComm, config: &Config) -> Result<Kolo, Error> {
    Kolo::start_with_abort(
        comm,
        config.clone(),
        |comm: &mut ThreadComm, message: &str| comm.fail(message),
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
    S: Fn(ThreadComm, &Config) -> Result<Kolo, Error> + Sync,
{
    let comms = kolo_threads::communicators(ranks).map_err(|e| Error::Start {
        message: format!("cannot create {ranks} thread ranks: {e}"),
    })?;
    // Failures stamped with the order in which the ranks' closures failed
    // (taken before the rank aborts, so a cause precedes its echoes).
    let failures: Mutex<Vec<(u64, Error)>> = Mutex::new(Vec::new());
    let clock = AtomicU64::new(0);
    let results: Vec<Option<R>> = std::thread::scope(|scope| {
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (f, start, failures, clock) = (&f, &start, &failures, &clock);
                std::thread::Builder::new()
                    .name(format!("kolo-user-{rank}"))
                    .spawn_scoped(scope, move || {
                        match run_rank(rank, start(comm, config), f, clock) {
                            Ok(result) => Some(result),
                            Err(failure) => {
                                failures.lock().push(failure);
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
                Ok(handle) => handle.join().unwrap_or_else(|_| {
                    // `run_rank` catches the closure's panics; this is kolo's own.
                    failures
                        .lock()
                        .push((u64::MAX, panicked("a rank's thread panicked")));
                    None
                }),
                Err((rank, e)) => {
                    failures.lock().push((
                        clock.fetch_add(1, Ordering::SeqCst),
                        Error::Start {
                            message: format!("cannot spawn the thread of rank {rank}: {e}"),
                        },
                    ));
                    None
                }
            })
            .collect()
    });
    if let Some((_, first)) = failures
        .into_inner()
        .into_iter()
        .min_by_key(|(order, _)| *order)
    {
        return Err(first);
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
            let message = format!("rank {rank} panicked: {}", panic_message(payload.as_ref()));
            kolo.abort(&message);
            Err((order, Error::RankFailed { rank, message }))
        }
    };
    drop(kolo);
    outcome
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a non-string panic payload)")
}

fn panicked(message: &str) -> Error {
    Error::Start {
        message: message.to_owned(),
    }
}
