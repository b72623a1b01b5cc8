//! [`Kolo`]: one rank's handle on its engine. The engine (see
//! [`crate::engine`]) is a background thread that owns the backend; `Kolo`
//! holds its [`Runtime`] — the tensor table and the command channel —
//! which keeps it free of the backend's type.

use crate::config::Config;
use crate::engine::autotune::Autotune;
use crate::engine::completion::Completion;
use crate::engine::launch::{launch_on_thread, launch_shared, Runtime};
use crate::engine::placement::DevicePlane;
use crate::engine::submission::Submission;
use crate::engine::watchdog::Guards;
use crate::error::Error;
use crate::set_label::SetLabel;
use crate::stats::Stats;
use kolo_timeline::Timeline;
use kolo_transport::Backend;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a backend's launcher leaves a world's [`Kolo`] so that it can
/// make process sets: starts this rank's engine of the set `label` on a
/// new communicator of its members. Every member calls it with the same
/// label.
pub(crate) trait SetMaker: Send + Sync {
    fn start(&self, label: &SetLabel, config: &Config) -> Result<Kolo, Error>;
}

/// One rank's entry point: submits collectives to the background engine.
///
/// `Kolo` is `Send + Sync`: several threads of a rank may submit operations
/// at once (each tensor name must be unique while in flight). Dropping it
/// shuts the engine down, which shuts down every rank (see
/// [`Kolo::shutdown`]).
pub struct Kolo {
    runtime: Runtime,
    config: Config,
    barriers: AtomicU64,
    joins: AtomicU64,
    /// How this world's backend makes process sets (none for a set's
    /// own engine, and for backends that cannot).
    sets: Option<Arc<dyn SetMaker>>,
    /// The sets made so far from each list of members, which tells the
    /// n-th set of a list from the others.
    ordinals: Mutex<HashMap<Vec<usize>, u32>>,
    /// The set this engine is of.
    set: Option<Arc<SetLabel>>,
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
        Kolo::start_sharing(backend, config, abort, None, Guards::default())
    }

    /// [`Kolo::start_with_abort`] with rank 0's timeline already open
    /// (`None`: opened from the config), so that a timeline that cannot
    /// be created fails before any rank starts (see
    /// [`crate::threads::run`]), and what the backend gives the watchdog.
    pub(crate) fn start_sharing<B, F>(
        backend: B,
        config: Config,
        abort: F,
        timeline: Option<Timeline>,
        guards: Guards,
    ) -> Result<Kolo, Error>
    where
        B: Backend + Send + 'static,
        F: FnOnce(&mut B, &str) + Send + 'static,
    {
        let runtime = launch_shared(backend, &config, abort, timeline, guards)?;
        Ok(Kolo::with(runtime, config))
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
        let make = move || make().map(|backend| (backend, None));
        let runtime = launch_on_thread(make, &config, abort, None, Guards::default())?;
        Ok(Kolo::with(runtime, config))
    }

    /// [`Kolo::start_on_thread`] with an optional device data plane, made
    /// on the engine's thread with the backend (the GPU engines), and rank
    /// 0's timeline perhaps already open (see [`Kolo::start_sharing`]).
    #[cfg_attr(not(any(feature = "nccl", feature = "mpi")), allow(dead_code))]
    pub(crate) fn start_engine<B, M, F>(
        make: M,
        config: Config,
        abort: F,
        timeline: Option<Timeline>,
        guards: Guards,
    ) -> Result<Kolo, Error>
    where
        B: Backend + 'static,
        M: FnOnce() -> Result<(B, Option<Box<dyn DevicePlane>>), Error> + Send + 'static,
        F: FnOnce(&mut B, &str) + Send + 'static,
    {
        let runtime = launch_on_thread(make, &config, abort, timeline, guards)?;
        Ok(Kolo::with(runtime, config))
    }

    /// The API over a started engine.
    fn with(runtime: Runtime, config: Config) -> Kolo {
        Kolo {
            runtime,
            config,
            barriers: AtomicU64::new(0),
            joins: AtomicU64::new(0),
            sets: None,
            ordinals: Mutex::new(HashMap::new()),
            set: None,
        }
    }

    /// This world's engine, able to make process sets with `maker`.
    pub(crate) fn making_sets(mut self, maker: Arc<dyn SetMaker>) -> Kolo {
        self.sets = Some(maker);
        self
    }

    /// How this world's backend makes process sets, where it can (see
    /// [`crate::ProcessSet`]).
    pub(crate) fn set_maker(&self) -> Option<&Arc<dyn SetMaker>> {
        self.sets.as_ref()
    }

    /// The process set this engine is of (`None` for a world's).
    pub(crate) fn process_set_label(&self) -> Option<&Arc<SetLabel>> {
        self.set.as_ref()
    }

    /// How many sets of `members` this rank made before (and counts one
    /// more).
    pub(crate) fn next_set_ordinal(&self, members: &[usize]) -> u32 {
        let mut ordinals = self.ordinals.lock();
        let next = ordinals.entry(members.to_vec()).or_insert(0);
        *next += 1;
        *next - 1
    }

    /// This engine as process set `label`'s: its errors name the set.
    pub(crate) fn of_set(mut self, label: Arc<SetLabel>) -> Kolo {
        self.runtime.name_process_set(Arc::clone(&label));
        self.set = Some(label);
        self
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.runtime.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.runtime.size
    }

    /// This rank among the ranks of its host: `LOCAL_RANK` under
    /// torchrun's variables, the node-local rank under mpirun, the rank
    /// itself for thread ranks (all on one host).
    pub fn local_rank(&self) -> usize {
        self.runtime.local.0
    }

    /// The number of ranks on this rank's host.
    pub fn local_size(&self) -> usize {
        self.runtime.local.1
    }

    /// The CUDA device whose tensors this engine reduces on the GPU
    /// (engines started by `kolo::nccl::run` or `Kolo::init_nccl_mpi`);
    /// `None` for host-only engines.
    pub fn gpu(&self) -> Option<usize> {
        self.runtime.gpu
    }

    /// The settings the engine runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A snapshot of this rank's engine counters.
    pub fn stats(&self) -> Stats {
        self.runtime.stats()
    }

    /// Where this rank's autotuner stands ([`Config::autotune`]): the
    /// fusion threshold and cycle time in effect now, whether they are
    /// still being tuned or settled, and on rank 0 the score each measured
    /// setting got. With autotuning off, the configured settings.
    pub fn autotune(&self) -> Autotune {
        self.runtime.autotune().unwrap_or_else(|| {
            Autotune::configured(
                self.config.fusion_threshold,
                self.config.cycle_time,
                self.config.autotune,
            )
        })
    }

    /// Frees this rank's fusion buffers now, host and device, and returns
    /// the bytes freed — as `torch.cuda.empty_cache()` empties PyTorch's.
    ///
    /// The engine keeps its fusion buffers between steps so that a
    /// repeated step allocates nothing, and trims them as the sizes it
    /// fuses shrink; a job moving to another phase (evaluation after
    /// training, a checkpoint) may want the memory back at once. The next
    /// fused operation allocates again at the size it needs. Local to this
    /// rank: nothing is sent to the others. Operations in flight are not
    /// disturbed: the engine frees the buffers between two cycles.
    ///
    /// ```
    /// kolo::threads::run(2, kolo::Config::default(), |kolo| {
    ///     let group = kolo::TensorGroup::new(["w", "b"])?;
    ///     let mut grads = vec![vec![1.0f32; 1 << 16], vec![1.0f32; 8]];
    ///     kolo.allreduce_group(&group, grads.iter_mut(), kolo::ReduceOp::Sum)?;
    ///     kolo.release_buffers()?;
    ///     assert_eq!(kolo.stats().fusion_buffer_bytes, 0);
    ///     Ok(())
    /// })?;
    /// # Ok::<(), kolo::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::ShutDown`] (or the failure that stopped it) once the engine
    /// stopped, and [`Error::Timeout`] if it does not get between two
    /// cycles within [`Config::timeout`].
    pub fn release_buffers(&self) -> Result<usize, Error> {
        self.runtime.release_buffers()
    }

    /// True once the engine stopped (shut down, aborted or failed); every
    /// later operation errs.
    pub fn is_shut_down(&self) -> bool {
        self.runtime.is_shut_down()
    }

    /// Asks every rank to shut down and waits until this rank's engine has
    /// stopped. Operations still pending on any rank then fail with
    /// [`Error::ShutDown`] naming the ranks that asked; later operations
    /// fail the same way. Idempotent; also done when `Kolo` is dropped.
    pub fn shutdown(&self) -> Result<(), Error> {
        self.runtime.shutdown()
    }

    /// Stops this rank at once, as failed: its pending operations fail with
    /// [`Error::RankFailed`] naming it, the backend is failed (see
    /// [`Kolo::start_with_abort`]) so that peers' pending operations fail
    /// the same way instead of hanging, and the engine stops.
    pub fn abort(&self, message: &str) {
        self.runtime.abort(message);
    }

    /// Submits the tensors of `group` together (they reach the same cycle,
    /// so they can fuse); all or none are accepted. Returns the
    /// submission's completion.
    pub(crate) fn submit(&self, submission: Submission<'_>) -> Result<Arc<Completion>, Error> {
        self.runtime
            .submit(submission)
            .map_err(|e| match &self.set {
                Some(set) => e.in_process_set(set),
                None => e,
            })
    }

    /// The next name of an internal barrier (the same sequence on every
    /// rank, as every rank calls `barrier` the same number of times; see
    /// [`control_name`]).
    pub(crate) fn next_barrier_name(&self) -> String {
        control_name("barrier", self.barriers.fetch_add(1, Ordering::Relaxed))
    }

    /// The next name of a join (see [`control_name`]).
    pub(crate) fn next_join_name(&self) -> String {
        control_name("join", self.joins.fetch_add(1, Ordering::Relaxed))
    }
}

/// How many names a rank's barriers (and, apart, its joins) cycle
/// through: also how many it may have in flight at once (a name is
/// refused while in flight).
pub(crate) const CONTROL_NAMES: u64 = 16;

/// The name of the `n`th barrier or join (`kind`) of a rank. The names
/// repeat every [`CONTROL_NAMES`] calls: a name of its own per call would
/// give every barrier a tensor id that the table, the coordinator (names,
/// per-id requests) and the response cache keep until thousands of names
/// have piled up (the table reclaims ids only from 4096 names on), about
/// 1.3 KiB per rank per barrier; a repeated name reuses its id and hits
/// the response cache like a training step's tensors.
pub(crate) fn control_name(kind: &str, n: u64) -> String {
    format!("__kolo/{kind}.{}", n % CONTROL_NAMES)
}

impl std::fmt::Debug for Kolo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kolo")
            .field("rank", &self.runtime.rank)
            .field("size", &self.runtime.size)
            .field("shut_down", &self.is_shut_down())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    //! Device tensors reach an engine's device check through `Kolo`.
    use super::*;
    use crate::handle::Handle;
    use crate::threads;
    use kolo_protocol::{DataType, Device, RequestKind};

    /// Submits an allreduce request on `device` with no data (the engine
    /// refuses device responses before looking at it).
    fn submit_on(kolo: &Kolo, name: &str, device: Device) -> Result<(), Error> {
        let params = kolo_protocol::Params {
            device,
            ..kolo.params(RequestKind::Allreduce, DataType::F32, &[4])
        };
        kolo.scope(|s| {
            let completion = s.submit_one(name, params, crate::engine::submission::Input::None)?;
            Handle::new(completion, |_| Ok(())).wait()
        })
    }

    #[test]
    fn a_cpu_gpu_mix_fails_on_every_rank_naming_tensor_and_ranks() {
        let errors = threads::run(2, Config::default(), |kolo| {
            let device = if kolo.rank() == 0 {
                Device::Cpu
            } else {
                Device::Cuda(1)
            };
            Ok(submit_on(kolo, "grad/mixed", device).err())
        })
        .unwrap();
        for error in errors {
            let Some(Error::Mismatch { tensor, message }) = error else {
                panic!("expected a mismatch, got {error:?}");
            };
            assert_eq!(tensor, "grad/mixed");
            assert!(message.contains("CPU/GPU"), "{message}");
            assert!(message.contains("rank 0 sent cpu"), "{message}");
            assert!(message.contains("rank 1 sent cuda:1"), "{message}");
        }
    }

    #[test]
    fn device_tensors_on_a_host_engine_fail_clearly() {
        let errors = threads::run(2, Config::default(), |kolo| {
            assert_eq!(kolo.gpu(), None);
            let device = Device::Cuda(kolo.rank() as u32);
            let first = submit_on(kolo, "grad/gpu", device).err();
            // The engine is still usable afterwards.
            let mut host = [1.0f32; 2];
            kolo.allreduce("grad/host", &mut host, kolo_protocol::ReduceOp::Sum)?;
            assert_eq!(host, [2.0; 2]);
            Ok(first)
        })
        .unwrap();
        for error in errors {
            let Some(Error::Collective { tensor, message }) = error else {
                panic!("expected a collective error, got {error:?}");
            };
            assert_eq!(tensor, "grad/gpu");
            assert!(message.contains("GPU engine"), "{message}");
        }
    }
}
