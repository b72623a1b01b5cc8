//! [`Kolo`]: one rank's handle on its engine. The engine itself is a
//! background thread that owns the backend (see `background.rs`; on a
//! host engine a caller waiting for its results may run the engine's
//! cycles, see `progress.rs`); `Kolo` only talks to it through the tensor
//! table, a channel and that hook, which keeps it free of the backend's
//! type.

use crate::background::{Background, Command, Core};
use crate::config::Config;
use crate::device::{DevicePlane, NoPlane, PlaneSlot};
use crate::error::Error;
use crate::group::Group;
use crate::handle::Completion;
use crate::panic_text::panic_text;
use crate::progress::Progress;
use crate::stats::Stats;
use crate::table::{Input, Table};
use crossbeam_channel::Sender;
use kolo_protocol::Params;
use kolo_timeline::Timeline;
use kolo_transport::Backend;
use parking_lot::Mutex;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

/// What the engine thread reports once its backend is up.
struct Started {
    rank: usize,
    size: usize,
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

/// The first exchange of every rank's engine, before any cycle: every
/// rank learns whether every other started, so that a rank that cannot
/// start (`failure`: why) fails every rank's engine, named, instead of
/// leaving its peers to wait for it. `Ok` when all started.
pub(crate) fn agree_start<B: Backend>(
    backend: &mut B,
    failure: Option<&Error>,
) -> Result<(), Error> {
    let mine = failure
        .map(|e| e.to_string().into_bytes())
        .unwrap_or_default();
    let every = backend
        .allgather_bytes(&mine)
        .map_err(Error::from_transport)?;
    match every.iter().position(|why| !why.is_empty()) {
        Some(rank) => Err(Error::RankFailed {
            rank,
            message: format!(
                "it could not start: {}",
                String::from_utf8_lossy(&every[rank])
            ),
        }),
        None => Ok(()),
    }
}

/// State shared by the user's threads and the background thread.
#[derive(Default)]
pub(crate) struct Shared {
    pub table: Mutex<Table>,
    pub stats: Mutex<Stats>,
}

/// One rank's entry point: submits collectives to the background engine.
///
/// `Kolo` is `Send + Sync`: several threads of a rank may submit operations
/// at once (each tensor name must be unique while in flight). Dropping it
/// shuts the engine down, which shuts down every rank (see
/// [`Kolo::shutdown`]).
pub struct Kolo {
    rank: usize,
    size: usize,
    /// The GPU of the engine's device data plane, if it has one.
    gpu: Option<usize>,
    config: Config,
    shared: Arc<Shared>,
    commands: Sender<Command>,
    thread: Mutex<Option<JoinHandle<()>>>,
    barriers: AtomicU64,
    joins: AtomicU64,
}

impl Kolo {
    /// Starts this rank's engine on `backend`: spawns the background thread
    /// that owns it. Every rank of the backend's communicator must start
    /// one. Rank 0 opens the timeline if `config` names one.
    ///
    /// The backend is `Send`, so a caller waiting on a handle may run the
    /// engine's cycles on its own thread while the background thread does
    /// not (blocking calls then need no hand-over to the background thread
    /// at all; [`Stats::caller_cycles`] counts them). Use
    /// [`Kolo::start_on_thread`] for a backend that must stay on one
    /// thread.
    pub fn start<B: Backend + Send + 'static>(backend: B, config: Config) -> Result<Kolo, Error> {
        Kolo::start_with_abort(backend, config, |_: &mut B, _: &str| {})
    }

    /// [`Kolo::start`] with a way to fail the backend: when the rank aborts
    /// ([`Kolo::abort`]), the background thread calls `abort(backend,
    /// message)` before dropping it, so that peers blocked on this rank
    /// fail at once naming it (kolo-threads' `ThreadComm::fail`, an MPI
    /// abort, ...).
    pub fn start_with_abort<B, F>(backend: B, config: Config, abort: F) -> Result<Kolo, Error>
    where
        B: Backend + Send + 'static,
        F: FnOnce(&mut B, &str) + Send + 'static,
    {
        Kolo::start_sharing(backend, config, abort, None)
    }

    /// [`Kolo::start_with_abort`] with rank 0's timeline already open
    /// (`None`: opened from the config), so that a timeline that cannot
    /// be created fails before any rank starts (see
    /// [`crate::threads::run`]).
    pub(crate) fn start_sharing<B, F>(
        backend: B,
        config: Config,
        abort: F,
        timeline: Option<Timeline>,
    ) -> Result<Kolo, Error>
    where
        B: Backend + Send + 'static,
        F: FnOnce(&mut B, &str) + Send + 'static,
    {
        // A `Send` backend may run on a waiting caller's thread too (see
        // `crate::progress`).
        Kolo::launch(
            move || Ok((backend, NoPlane)),
            config,
            abort,
            |engine| {
                let progress: Weak<dyn Progress> = Arc::downgrade(engine.shareable()) as _;
                Some(progress)
            },
            timeline,
        )
    }

    /// Starts the engine with a backend that `make` creates on the engine's
    /// background thread, which then makes every backend call. This is how
    /// backends that must stay on one thread run: MPI initialised with
    /// `MPI_THREAD_FUNNELED` (only the initialising thread may call MPI),
    /// and NCCL, whose communicator is not `Send`. `abort` is as in
    /// [`Kolo::start_with_abort`].
    pub fn start_on_thread<B, M, F>(make: M, config: Config, abort: F) -> Result<Kolo, Error>
    where
        B: Backend + 'static,
        M: FnOnce() -> Result<B, Error> + Send + 'static,
        F: FnOnce(&mut B, &str) + Send + 'static,
    {
        Kolo::launch(
            move || make().map(|b| (b, NoPlane)),
            config,
            abort,
            |_| None,
            None,
        )
    }

    /// [`Kolo::start_on_thread`] with an optional device data plane, made
    /// on the engine's thread with the backend (the GPU engines), and rank
    /// 0's timeline perhaps already open (see [`Kolo::start_sharing`]).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn start_engine<B, M, F>(
        make: M,
        config: Config,
        abort: F,
        timeline: Option<Timeline>,
    ) -> Result<Kolo, Error>
    where
        B: Backend + 'static,
        M: FnOnce() -> Result<(B, Option<Box<dyn DevicePlane>>), Error> + Send + 'static,
        F: FnOnce(&mut B, &str) + Send + 'static,
    {
        Kolo::launch(make, config, abort, |_| None, timeline)
    }

    /// Spawns the background thread, which makes the backend and device
    /// plane with `make`, opens rank 0's timeline (unless `timeline` is
    /// given), agrees with every rank that all of them started, and serves
    /// them; `share` says how a waiting caller may run the engine's
    /// cycles, if it may.
    fn launch<B, D, M, F, S>(
        make: M,
        config: Config,
        abort: F,
        share: S,
        timeline: Option<Timeline>,
    ) -> Result<Kolo, Error>
    where
        B: Backend + 'static,
        D: PlaneSlot + 'static,
        M: FnOnce() -> Result<(B, D), Error> + Send + 'static,
        F: FnOnce(&mut B, &str) + Send + 'static,
        S: FnOnce(&Background<B, D>) -> Option<Weak<dyn Progress>> + Send + 'static,
    {
        config.validate()?;
        let shared = Arc::new(Shared::default());
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
                            let _ = agree_start(&mut backend, Some(&e));
                            return Err(None);
                        }
                    };
                    let (rank, size) = (backend.rank(), backend.size());
                    let started = Started {
                        rank,
                        size,
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
                    crate::background::fail_all(
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
        let Started { rank, size, gpu } = match ready_rx.recv() {
            Ok(Ok(started)) => started,
            // The thread ends on its own once it told the peers (see
            // `agree_start`): a caller that starts its ranks one after the
            // other must not wait for that.
            Ok(Err(e)) => return Err(e),
            Err(_) => {
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
        Ok(Kolo {
            rank,
            size,
            gpu,
            config,
            shared,
            commands,
            thread: Mutex::new(Some(thread)),
            barriers: AtomicU64::new(0),
            joins: AtomicU64::new(0),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The CUDA device whose tensors this engine reduces on the GPU
    /// (engines started by `kolo::nccl::run` or `Kolo::init_nccl_mpi`);
    /// `None` for host-only engines.
    pub fn gpu(&self) -> Option<usize> {
        self.gpu
    }

    /// The settings the engine runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A snapshot of this rank's engine counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().clone()
    }

    /// True once the engine stopped (shut down, aborted or failed); every
    /// later operation errs.
    pub fn is_shut_down(&self) -> bool {
        self.shared.table.lock().closed().is_some()
    }

    /// Asks every rank to shut down and waits until this rank's engine has
    /// stopped. Operations still pending on any rank then fail with
    /// [`Error::ShutDown`] naming the ranks that asked; later operations
    /// fail the same way. Idempotent; also done when `Kolo` is dropped.
    pub fn shutdown(&self) -> Result<(), Error> {
        // A closed channel means the engine already stopped.
        let _ = self.commands.send(Command::Shutdown);
        self.join_engine()
    }

    /// Stops this rank at once, as failed: its pending operations fail with
    /// [`Error::RankFailed`] naming it, the backend is failed (see
    /// [`Kolo::start_with_abort`]) so that peers' pending operations fail
    /// the same way instead of hanging, and the engine stops.
    pub fn abort(&self, message: &str) {
        let _ = self.commands.send(Command::Abort(message.to_owned()));
        // The engine reports its own failure to the waiting handles; joining
        // only waits for it.
        let _ = self.join_engine();
    }

    /// Waits for the background thread to end.
    fn join_engine(&self) -> Result<(), Error> {
        let Some(thread) = self.thread.lock().take() else {
            return Ok(());
        };
        thread.join().map_err(|panic| Error::RankFailed {
            rank: self.rank,
            message: format!(
                "kolo's background thread panicked: {}",
                panic_text(panic.as_ref())
            ),
        })
    }

    /// Submits one tensor whose handle gets an output (the engine's copy
    /// of the result).
    pub(crate) fn submit_one(
        &self,
        name: &str,
        params: Params,
        input: Input,
    ) -> Result<Arc<Completion>, Error> {
        let shape = params.shape.clone();
        let mut group = Group::new(params, 1, true, None);
        group.push(name, &shape, input);
        self.submit(group)
    }

    /// Submits the tensors of `group` together (they reach the same cycle,
    /// so they can fuse); all or none are accepted. Returns the
    /// submission's completion.
    pub(crate) fn submit(&self, group: Group<'_>) -> Result<Arc<Completion>, Error> {
        if group.len() == 0 {
            return Ok(Completion::new(
                Arc::default(),
                group.payloads,
                group.lease,
                None,
            ));
        }
        let (completion, wake) = self.shared.table.lock().insert(group)?;
        if wake {
            // If the engine stopped since, it closed the table and failed
            // these entries already: the handle reports why.
            let _ = self.commands.send(Command::Wake);
        }
        Ok(completion)
    }

    /// The next name of an internal barrier (the same sequence on every
    /// rank, as every rank calls `barrier` the same number of times).
    pub(crate) fn next_barrier_name(&self) -> String {
        format!(
            "__kolo/barrier.{}",
            self.barriers.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The next name of a join.
    pub(crate) fn next_join_name(&self) -> String {
        format!("__kolo/join.{}", self.joins.fetch_add(1, Ordering::Relaxed))
    }
}

impl Drop for Kolo {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl std::fmt::Debug for Kolo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kolo")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("shut_down", &self.is_shut_down())
            .finish()
    }
}
