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
use crate::progress::Progress;
use crate::stats::Stats;
use crate::table::{Input, Table};
use crossbeam_channel::Sender;
use kolo_protocol::Params;
use kolo_timeline::Timeline;
use kolo_transport::Backend;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

/// What the engine thread reports once its backend is up: rank, size and
/// the GPU of its device plane.
type Topology = (usize, usize, Option<usize>);

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
        )
    }

    /// [`Kolo::start_on_thread`] with an optional device data plane, made
    /// on the engine's thread with the backend (the GPU engines).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn start_engine<B, M, F>(make: M, config: Config, abort: F) -> Result<Kolo, Error>
    where
        B: Backend + 'static,
        M: FnOnce() -> Result<(B, Option<Box<dyn DevicePlane>>), Error> + Send + 'static,
        F: FnOnce(&mut B, &str) + Send + 'static,
    {
        Kolo::launch(make, config, abort, |_| None)
    }

    /// Spawns the background thread, which makes the backend and device
    /// plane with `make` and serves them; `share` says how a waiting
    /// caller may run the engine's cycles, if it may.
    fn launch<B, D, M, F, S>(make: M, config: Config, abort: F, share: S) -> Result<Kolo, Error>
    where
        B: Backend + 'static,
        D: PlaneSlot + 'static,
        M: FnOnce() -> Result<(B, D), Error> + Send + 'static,
        F: FnOnce(&mut B, &str) + Send + 'static,
        S: FnOnce(&Background<B, D>) -> Option<Weak<dyn Progress>> + Send + 'static,
    {
        let shared = Arc::new(Shared::default());
        let (commands, receiver) = crossbeam_channel::unbounded();
        let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Result<Topology, Error>>(1);
        let engine_config = config.clone();
        let engine_shared = Arc::clone(&shared);
        let wake = commands.clone();
        let thread = std::thread::Builder::new()
            .name("kolo-engine".into())
            .spawn(move || {
                let (backend, plane) = match make() {
                    Ok(made) => made,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let (rank, size) = (backend.rank(), backend.size());
                let gpu = plane.ordinal();
                let timeline = match (&engine_config.timeline, rank) {
                    (Some(path), 0) => {
                        match Timeline::create(path, engine_config.timeline_mark_cycles) {
                            Ok(timeline) => timeline,
                            Err(e) => {
                                let _ = ready_tx.send(Err(Error::Timeline {
                                    path: path.clone(),
                                    message: e.to_string(),
                                }));
                                return;
                            }
                        }
                    }
                    _ => Timeline::disabled(),
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
                let _ = ready_tx.send(Ok((rank, size, gpu)));
                engine.run()
            })
            .map_err(|e| Error::Start {
                message: format!("cannot spawn the engine's background thread: {e}"),
            })?;
        let (rank, size, gpu) = match ready_rx.recv() {
            Ok(Ok(topology)) => topology,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::Start {
                    message: "the engine's background thread ended before starting its backend"
                        .into(),
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
        thread.join().map_err(|_| Error::RankFailed {
            rank: self.rank,
            message: "kolo's background thread panicked".into(),
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
