//! Starting a rank's engine and the handle on a running one: the
//! background thread is spawned, makes the backend (and device plane) on
//! itself, opens rank 0's timeline, agrees with every rank that all of
//! them started, and serves; [`Runtime`] is what the API layer holds of
//! it — the tensor table, the command channel and the thread.

use crate::config::Config;
use crate::engine::autotune::Autotune;
use crate::engine::background::{Background, Command};
use crate::engine::completion::Completion;
use crate::engine::cycle::{agree_start, Core};
use crate::engine::placement::{DevicePlane, NoPlane, PlaneSlot};
use crate::engine::progress::Progress;
use crate::engine::shared::{fail_all, Shared};
use crate::engine::submission::Submission;
use crate::engine::watchdog::{Guards, Watch, Watchdog};
use crate::error::Error;
use crate::panic_text::panic_text;
use crate::set_label::SetLabel;
use crate::stats::Stats;
use crossbeam_channel::Sender;
use kolo_timeline::Timeline;
use kolo_transport::Backend;
use parking_lot::Mutex;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a rank's teardown may wait for its engine's thread once the
/// backend was interrupted (past the operation timeout): a thread stuck in
/// a call that cannot be interrupted (MPI's) is then left to the process's
/// exit.
const TEARDOWN_BOUND: Duration = Duration::from_secs(10);

/// What the engine thread reports once its backend is up.
struct Started {
    rank: usize,
    size: usize,
    /// Where it stands among the ranks of its host.
    local: (usize, usize),
    /// The GPU of its device plane.
    gpu: Option<usize>,
}

/// Opens rank 0's timeline as `config` asks (a disabled one elsewhere, or
/// when the config names none).
pub(crate) fn open_timeline(config: &Config, rank: usize) -> Result<Timeline, Error> {
    match (&config.timeline, rank) {
        (Some(path), 0) => {
            Timeline::create(path, config.timeline_mark_cycles).map_err(|e| Error::Timeline {
                path: path.clone(),
                message: e.to_string(),
            })
        }
        _ => Ok(Timeline::disabled()),
    }
}

/// A running engine, as its rank's API holds it. Dropping it shuts the
/// engine down (which shuts down every rank, see [`Runtime::shutdown`]).
pub(crate) struct Runtime {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// The rank among the ranks of this host, and their number.
    pub(crate) local: (usize, usize),
    /// The GPU of the engine's device data plane, if it has one.
    pub(crate) gpu: Option<usize>,
    shared: Arc<Shared>,
    commands: Sender<Command>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Bounds operations in time and spreads faults (see
    /// [`crate::engine::watchdog`]).
    watchdog: Mutex<Option<Watchdog>>,
    /// The operation timeout, which also bounds a shutdown's wait for
    /// the ranks' agreement.
    timeout: Option<Duration>,
}

/// Starts an engine on a `Send` backend: a caller waiting on a handle may
/// run the engine's cycles on its own thread while the background thread
/// does not (see [`crate::engine::progress`]). `timeline`: rank 0's,
/// already open (`None`: opened from the config).
pub(crate) fn launch_shared<B, F>(
    backend: B,
    config: &Config,
    abort: F,
    timeline: Option<Timeline>,
    guards: Guards,
) -> Result<Runtime, Error>
where
    B: Backend + Send + 'static,
    F: FnOnce(&mut B, &str) + Send + 'static,
{
    launch(
        move || Ok((backend, NoPlane)),
        config,
        abort,
        |engine| {
            let progress: Weak<dyn Progress> = Arc::downgrade(engine.shareable()) as _;
            Some(progress)
        },
        timeline,
        guards,
    )
}

/// Starts an engine whose backend (and device plane, for the GPU engines)
/// `make` creates on the engine's background thread, which then makes
/// every backend call: backends that must stay on one thread (MPI
/// initialised `FUNNELED`, NCCL).
pub(crate) fn launch_on_thread<B, M, F>(
    make: M,
    config: &Config,
    abort: F,
    timeline: Option<Timeline>,
    guards: Guards,
) -> Result<Runtime, Error>
where
    B: Backend + 'static,
    M: FnOnce() -> Result<(B, Option<Box<dyn DevicePlane>>), Error> + Send + 'static,
    F: FnOnce(&mut B, &str) + Send + 'static,
{
    launch(make, config, abort, |_| None, timeline, guards)
}

/// Spawns the background thread, which makes the backend and device
/// plane with `make`, opens rank 0's timeline (unless `timeline` is
/// given), agrees with every rank that all of them started, and serves
/// them; `share` says how a waiting caller may run the engine's
/// cycles, if it may.
fn launch<B, D, M, F, S>(
    make: M,
    config: &Config,
    abort: F,
    share: S,
    timeline: Option<Timeline>,
    guards: Guards,
) -> Result<Runtime, Error>
where
    B: Backend + 'static,
    D: PlaneSlot + 'static,
    M: FnOnce() -> Result<(B, D), Error> + Send + 'static,
    F: FnOnce(&mut B, &str) + Send + 'static,
    S: FnOnce(&Background<B, D>) -> Option<Weak<dyn Progress>> + Send + 'static,
{
    config.validate()?;
    let shared = Arc::new(Shared {
        stall_timeout: config.timeout.filter(|_| config.stall_is_timeout()),
        ..Shared::default()
    });
    let (commands, receiver) = crossbeam_channel::unbounded();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Result<Started, Error>>(1);
    let engine_config = config.clone();
    let engine_shared = Arc::clone(&shared);
    let wake = commands.clone();
    let thread = std::thread::Builder::new()
        .name("kolo-engine".into())
        .spawn(move || {
            // A panic while starting is reported with its message
            // (the caller would otherwise only see the thread end).
            let built = catch_unwind(AssertUnwindSafe(|| {
                let (mut backend, plane) = make().map_err(Some)?;
                let timeline = match timeline {
                    Some(timeline) => Ok(timeline),
                    None => open_timeline(&engine_config, backend.rank()),
                };
                let timeline = match timeline {
                    Ok(timeline) => timeline,
                    Err(e) => {
                        // The caller learns first; then the peers,
                        // whose first cycle waits for this exchange.
                        let _ = ready_tx.send(Err(e.clone()));
                        let _ = agree_start(&mut backend, Some(&e), engine_config.autotune);
                        return Err(None);
                    }
                };
                let (rank, size) = (backend.rank(), backend.size());
                let started = Started {
                    rank,
                    size,
                    local: (backend.local_rank(), backend.local_size()),
                    gpu: plane.ordinal(),
                };
                let core = Core::new(
                    backend,
                    &engine_config,
                    timeline,
                    Arc::clone(&engine_shared),
                    plane,
                );
                let engine = Background::new(core, &engine_config, receiver, wake, abort);
                if let Some(progress) = share(&engine) {
                    engine_shared.table.lock().set_progress(progress);
                }
                Ok((engine, started))
            }));
            let (engine, started) = match built {
                Ok(Ok(built)) => built,
                Ok(Err(told)) => {
                    if let Some(e) = told {
                        let _ = ready_tx.send(Err(e));
                    }
                    return;
                }
                Err(panic) => {
                    let _ = ready_tx.send(Err(Error::Start {
                        message: format!(
                            "the engine's background thread panicked while starting: {}",
                            panic_text(panic.as_ref())
                        ),
                    }));
                    return;
                }
            };
            let rank = started.rank;
            let _ = ready_tx.send(Ok(started));
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| engine.run())) {
                fail_all(
                    &engine_shared,
                    Error::RankFailed {
                        rank,
                        message: format!(
                            "kolo's background thread panicked: {}",
                            panic_text(panic.as_ref())
                        ),
                    },
                );
                resume_unwind(panic);
            }
        })
        .map_err(|e| Error::Start {
            message: format!("cannot spawn the engine's background thread: {e}"),
        })?;
    let Started {
        rank,
        size,
        local,
        gpu,
    } = match wait_for_start(&ready_rx, config.start_timeout) {
        Ok(Ok(started)) => started,
        // The thread ends on its own once it told the peers (see
        // `agree_start`): a caller that starts its ranks one after the
        // other must not wait for that.
        Ok(Err(e)) => return Err(e),
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            // The engine's thread stays blocked where its backend hangs
            // (a call like MPI_Init cannot be interrupted); the process
            // ends it when it exits with this error.
            return Err(Error::Start {
                message: format!(
                    "the backend did not start within {:?} (KOLO_START_TIMEOUT): a process of \
                     the job may have exited or hung before joining it (under mpirun, one \
                     that never initialised MPI), or a rendezvous or GPU did not answer",
                    config.start_timeout.unwrap_or_default()
                ),
            });
        }
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
            let why = match thread.join() {
                Err(panic) => format!("it panicked: {}", panic_text(panic.as_ref())),
                Ok(()) => "it ended without a word".into(),
            };
            return Err(Error::Start {
                message: format!(
                    "the engine's background thread ended before starting its backend: {why}"
                ),
            });
        }
    };
    tracing::debug!(rank, size, ?gpu, ?config, "kolo engine started");
    let watchdog = Watchdog::start(Watch {
        rank,
        size,
        timeout: config.timeout,
        shared: Arc::clone(&shared),
        commands: commands.clone(),
        guards,
    });
    Ok(Runtime {
        rank,
        size,
        local,
        gpu,
        shared,
        commands,
        thread: Mutex::new(Some(thread)),
        watchdog: Mutex::new(watchdog),
        timeout: config.timeout,
    })
}

impl Runtime {
    /// A snapshot of the engine's counters.
    pub(crate) fn stats(&self) -> Stats {
        self.shared.stats.lock().clone()
    }

    /// The autotuner's state, once the engine published it.
    pub(crate) fn autotune(&self) -> Option<Autotune> {
        self.shared.autotune.lock().clone()
    }

    /// Asks the engine to free its fusion buffers between two cycles and
    /// waits for it, at most the operation timeout (a busy engine frees
    /// them after its current cycle). Returns the bytes freed.
    pub(crate) fn release_buffers(&self) -> Result<usize, Error> {
        let stopped = || {
            self.shared
                .table
                .lock()
                .closed()
                .cloned()
                .unwrap_or(Error::ShutDown {
                    by_ranks: Vec::new(),
                })
        };
        let (reply, answer) = crossbeam_channel::bounded(1);
        if self.commands.send(Command::ReleaseBuffers(reply)).is_err() {
            return Err(stopped());
        }
        let answered = match self.timeout {
            Some(timeout) => answer.recv_timeout(timeout).map_err(|e| e.is_timeout()),
            None => answer.recv().map_err(|_| false),
        };
        match answered {
            Ok(bytes) => Ok(bytes),
            Err(true) => Err(Error::Timeout {
                tensor: "kolo.release_buffers".into(),
                after: self.timeout.unwrap_or_default(),
                report: "the engine did not finish its cycle to free the fusion buffers".into(),
            }),
            // The engine stopped before it got to the request.
            Err(false) => Err(stopped()),
        }
    }

    /// True once the engine stopped (shut down, aborted or failed).
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shared.table.lock().closed().is_some()
    }

    /// Asks every rank to shut down and waits until this rank's engine has
    /// stopped. Idempotent.
    pub(crate) fn shutdown(&self) -> Result<(), Error> {
        // A closed channel means the engine already stopped.
        let _ = self.commands.send(Command::Shutdown);
        self.join()
    }

    /// Stops this rank at once, as failed (see [`crate::Kolo::abort`]).
    pub(crate) fn abort(&self, message: &str) {
        let _ = self.commands.send(Command::Abort(message.to_owned()));
        // The engine reports its own failure to the waiting handles; joining
        // only waits for it.
        let _ = self.join();
    }

    /// Waits for the background thread to end, then stops the watchdog.
    ///
    /// Bounded where operations are ([`Config::timeout`]): a shutdown
    /// waits for every rank's agreement, and a peer that stopped answering
    /// would hold it forever. Past the timeout the backend's waits are
    /// interrupted, and past [`TEARDOWN_BOUND`] more the thread is left
    /// behind (stuck in a call that cannot be interrupted) with an error.
    fn join(&self) -> Result<(), Error> {
        let Some(thread) = self.thread.lock().take() else {
            return Ok(());
        };
        let finished = self.timeout.is_none_or(|timeout| {
            wait_for_thread(&thread, timeout) || {
                let why = format!(
                    "kolo's engine did not stop within {} s (KOLO_TIMEOUT): a peer stopped \
                     answering",
                    timeout.as_secs_f64()
                );
                tracing::error!(rank = self.rank, "{why}");
                if let Some(watchdog) = &*self.watchdog.lock() {
                    watchdog.interrupt(&why);
                }
                let _ = self.commands.send(Command::Abort(why));
                wait_for_thread(&thread, TEARDOWN_BOUND)
            }
        });
        let clean = finished
            && matches!(
                self.shared.table.lock().closed(),
                Some(Error::ShutDown { .. })
            );
        if !finished {
            if let Some(mut watchdog) = self.watchdog.lock().take() {
                watchdog.stop(false);
            }
            return Err(Error::RankFailed {
                rank: self.rank,
                message: format!(
                    "kolo's engine thread did not stop within {} s of being interrupted; \
                     it is left to the process's exit",
                    TEARDOWN_BOUND.as_secs()
                ),
            });
        }
        let joined = thread.join();
        if let Some(mut watchdog) = self.watchdog.lock().take() {
            watchdog.stop(clean);
        }
        joined.map_err(|panic| Error::RankFailed {
            rank: self.rank,
            message: format!(
                "kolo's background thread panicked: {}",
                panic_text(panic.as_ref())
            ),
        })
    }

    /// Submits the tensors of `submission` together (they reach the same
    /// cycle, so they can fuse); all or none are accepted. Returns the
    /// submission's completion.
    /// Makes this the engine of process set `set`: the errors of its
    /// operations name it (see [`Error::in_process_set`]).
    pub(crate) fn name_process_set(&self, set: Arc<SetLabel>) {
        self.shared.table.lock().set_process_set(set);
    }

    pub(crate) fn submit(&self, submission: Submission<'_>) -> Result<Arc<Completion>, Error> {
        if submission.len() == 0 {
            return Ok(Completion::new(
                Arc::default(),
                submission.payloads,
                submission.lease,
                None,
            ));
        }
        let (completion, wake) = self.shared.table.lock().insert(submission)?;
        if wake {
            // If the engine stopped since, it closed the table and failed
            // these entries already: the handle reports why.
            let _ = self.commands.send(Command::Wake);
        }
        Ok(completion)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Waits up to `bound` for `thread` to finish; true if it did.
fn wait_for_thread(thread: &JoinHandle<()>, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while !thread.is_finished() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// The engine thread's word on its start, waiting at most `bound` (`None`:
/// as long as it takes).
fn wait_for_start(
    ready: &crossbeam_channel::Receiver<Result<Started, Error>>,
    bound: Option<std::time::Duration>,
) -> Result<Result<Started, Error>, crossbeam_channel::RecvTimeoutError> {
    match bound {
        Some(bound) => ready.recv_timeout(bound),
        None => ready
            .recv()
            .map_err(|_| crossbeam_channel::RecvTimeoutError::Disconnected),
    }
}
