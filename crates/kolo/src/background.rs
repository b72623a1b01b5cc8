//! The background thread of a rank: runs the coordinator's cycle around
//! the backend, and performs the agreed responses in order.
//!
//! It sleeps on the command channel: a submission wakes it at once (a busy
//! rank cycles right away), and an idle rank cycles anyway after the cycle
//! time, so that peers' collectives complete and the stall inspector runs.
//! The state it cycles ([`Core`]) sits behind a lock: on a host engine a
//! caller waiting for its own results may run the cycles instead (see
//! [`crate::progress`]), and the thread then only waits.

use crate::batches::{Batches, PartRef, Whole};
use crate::config::Config;
use crate::device::PlaneSlot;
use crate::engine::Shared;
use crate::error::Error;
use crate::handle::Payload;
use crate::panic_text::panic_text;
use crate::table::{Entry, Input, Requests, Taken};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use kolo_coordinator::{
    Agreed, Agreement, Coordinator, CoordinatorError, Cycle, CycleOutput, Hit, Intake,
    NegotiationEvent, TensorId,
};
use kolo_fusion::{Edge, FusionBuffers, Phase};
use kolo_protocol::{DataType, Params, RequestKind, Response, ResponseKind};
use kolo_timeline::{activity, Timeline};
use kolo_transport::{with_element_type, Backend, Element, TransportError};
use parking_lot::Mutex;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the background thread polls for new work, yielding the CPU,
/// before it sleeps on the channel, on a host with fewer cores than kolo
/// has threads there (each rank's caller and its engine): a yield then
/// hands the core to a caller that needs it, and polling longer measured
/// 8% slower on 2 ranks of a 2-core machine.
const SHORT_POLL: Duration = Duration::from_micros(50);

/// [`SHORT_POLL`] on a host where every rank's caller and engine can each
/// have a core: a caller's next step then finds its engine awake, instead
/// of waking a thread asleep on an idle core (15-20 us a step on a 16-core
/// host, measured). Bounded, so an idle engine still goes to sleep.
const LONG_POLL: Duration = Duration::from_micros(500);

/// The poll before sleeping for `local_ranks` ranks on a host of `cores`.
fn poll_budget(local_ranks: usize, cores: usize) -> Duration {
    if local_ranks.saturating_mul(2) <= cores {
        LONG_POLL
    } else {
        SHORT_POLL
    }
}

/// What user threads tell the background thread.
pub(crate) enum Command {
    /// New requests are queued in the tensor table (or a caller that ran
    /// cycles left work behind).
    Wake,
    /// Ask every rank to shut down.
    Shutdown,
    /// Stop at once, as failed, with this message.
    Abort(String),
}

/// Fails the backend when the rank aborts.
type AbortHook<B> = Box<dyn FnOnce(&mut B, &str) + Send>;

/// One rank's engine state: the coordinator and the engine that performs
/// what it agreed. One thread at a time runs its cycles: the background
/// thread, or a caller waiting for its own results (see
/// [`crate::progress`]), whichever holds the lock around it.
pub(crate) struct Core<B, D> {
    coordinator: Coordinator,
    engine: Engine<B, D>,
    shutdown_requested: bool,
    /// Why the engine stopped, once it has (its teardown is done).
    stopped: Option<Error>,
    /// When the last cycle started: an idle rank cycles once per cycle
    /// time, whichever thread ran the cycles before.
    last_cycle: Instant,
    /// Every rank's engine started (see [`crate::engine::agree_start`]),
    /// agreed before the first cycle, by whichever thread runs it.
    agreed: bool,
}

/// A [`Core`] with the background thread's channel: what a caller's
/// thread that runs cycles shares with the background thread.
pub(crate) struct Shareable<B, D> {
    pub(crate) core: Mutex<Core<B, D>>,
    /// Wakes the background thread when a caller leaves work behind.
    pub(crate) wake: Sender<Command>,
}

/// One rank's background thread: waits for work and runs the cycles of
/// its [`Core`] while no caller does.
pub(crate) struct Background<B, D> {
    shared: Arc<Shareable<B, D>>,
    cycle_time: Duration,
    /// How long to poll for work before sleeping ([`poll_budget`]).
    poll: Duration,
    commands: Receiver<Command>,
    abort: Option<AbortHook<B>>,
}

/// What performs the agreed responses: the backend, the fusion buffers,
/// the timeline, and the tensors taken from the table (this thread's side
/// of it).
pub(crate) struct Engine<B, D> {
    pub(crate) backend: B,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    fusion_threshold: usize,
    pub(crate) buffers: FusionBuffers,
    pub(crate) timeline: Timeline,
    pub(crate) shared: Arc<Shared>,
    /// The GPU data plane serving responses on device tensors, if any.
    pub(crate) device: D,
    /// Where each tensor taken from the table's queue and not performed
    /// yet is: its submission and part, by id (the inputs are with the
    /// submissions).
    held: Vec<Option<PartRef>>,
    /// Their submissions.
    pub(crate) batches: Batches,
    /// The last cycle's fusion plan, for a cycle that repeats it.
    plan: PlanMemo,
}

/// One response of a cycle as the engine performs it: the response (rank
/// 0's, or a cached one) and this rank's id for its tensor.
pub(crate) struct Work<'c> {
    pub response: &'c Response,
    pub id: Option<TensorId>,
}

/// This rank's parameters for the tensors it performs (the
/// coordinator's record of its last request for each).
#[derive(Clone, Copy)]
pub(crate) struct ParamsOf<'c>(&'c Coordinator);

impl<'c> ParamsOf<'c> {
    /// The parameters of `entry`'s tensor.
    pub(crate) fn of(self, entry: &Entry) -> Option<&'c Params> {
        self.0.params(entry.id)
    }

    /// The shape `entry`'s tensor was submitted with (empty if unknown, a
    /// kolo bug: every request reaches the coordinator before its
    /// response).
    pub(crate) fn shape(self, entry: &Entry) -> Vec<u64> {
        self.of(entry).map(|p| p.shape.to_vec()).unwrap_or_default()
    }
}

/// The fusion plan of a cycle settled entirely by the cache, with what
/// makes it valid: the same hits, the same cache contents (generation) and
/// the same threshold give the same plan (it is a pure function of the
/// responses), so a training step that repeats the last one reuses it
/// without reading a response.
///
/// When that plan was one fused allreduce run straight over one whole
/// submission of lent tensors, `whole` keeps that submission's ids (the
/// tensor table hands a repeated group the same `Arc` each time, and
/// holding it keeps the pointer from being reused): a later cycle agreeing
/// on the same slots, with that group held whole again, is performed
/// before the coordinator settles its books (see [`Core::step`]).
#[derive(Default)]
struct PlanMemo {
    slots: Vec<usize>,
    generation: u64,
    plan: Option<kolo_fusion::FusionPlan>,
    whole: Option<Arc<[TensorId]>>,
}

/// Closes the table with `reason` and fails every submission still queued.
pub(crate) fn fail_all(shared: &Shared, reason: Error) {
    let queued = shared.table.lock().close(reason.clone());
    for completion in queued {
        completion.fail_open(|_| reason.clone());
    }
}

impl<B: Backend, D: PlaneSlot> Core<B, D> {
    /// A rank's engine state on `backend`, with the device plane `device`.
    pub(crate) fn new(
        backend: B,
        config: &Config,
        timeline: Timeline,
        shared: Arc<Shared>,
        device: D,
    ) -> Self {
        let (rank, size) = (backend.rank(), backend.size());
        Core {
            coordinator: Coordinator::new(rank, size, config.coordinator()),
            engine: Engine {
                backend,
                rank,
                size,
                fusion_threshold: config.fusion_threshold,
                buffers: FusionBuffers::new(),
                timeline,
                shared,
                device,
                held: Vec::new(),
                batches: Batches::default(),
                plan: PlanMemo::default(),
            },
            shutdown_requested: false,
            stopped: None,
            last_cycle: Instant::now(),
            agreed: false,
        }
    }

    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.engine.rank
    }

    /// True once the engine stopped.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// True while a cycle has something to do: a shutdown to agree on,
    /// submissions queued in the table, or requests the ranks have not all
    /// agreed to yet.
    pub(crate) fn has_work(&self) -> bool {
        self.shutdown_requested
            || self.coordinator.pending() > 0
            || self.engine.shared.table.lock().has_queued()
    }

    /// True once an idle rank is due to cycle (see [`Core::last_cycle`]).
    fn idle_cycle_due(&self, cycle_time: Duration) -> bool {
        self.last_cycle.elapsed() >= cycle_time
    }

    /// Runs one cycle: takes the queued submissions, negotiates, and
    /// performs what the ranks agreed. `Err` says why the engine stops
    /// (shut down, or failed); stopping is then up to the caller
    /// ([`Core::stop`]).
    pub(crate) fn step(&mut self) -> Result<(), Error> {
        if !self.agreed {
            crate::engine::agree_start(&mut self.engine.backend, None)?;
            self.agreed = true;
        }
        self.last_cycle = Instant::now();
        let requests = self.take_queued()?;
        let busy = !requests.is_empty();
        let cycle = match self.coordinator.cycle_deferring(
            &mut self.engine.backend,
            requests,
            self.shutdown_requested,
            Instant::now(),
        ) {
            Ok(cycle) => cycle,
            Err(CoordinatorError::Transport(e)) => return Err(Error::from_transport(e)),
            Err(e @ CoordinatorError::CacheCapacityMismatch { capacity, .. }) => {
                return Err(Error::Config {
                    variable: "KOLO_CACHE_CAPACITY".into(),
                    value: capacity.to_string(),
                    reason: e.to_string(),
                })
            }
            Err(other) => {
                return Err(Error::Transport(kolo_transport::TransportError::Backend(
                    other.to_string(),
                )))
            }
        };
        let output = match cycle {
            Cycle::Done(output) => self.perform_cycle(output, busy),
            Cycle::Hits(agreement) => self.repeat_or_perform(agreement, busy),
        };
        if output.shutdown {
            return Err(Error::ShutDown {
                by_ranks: output.shutdown_ranks,
            });
        }
        Ok(())
    }

    /// Counts a cycle that a caller's thread ran.
    pub(crate) fn count_caller_cycle(&self) {
        self.engine.shared.stats.lock().caller_cycles += 1;
    }

    /// Stops the engine for `reason`: closes the table (nothing new
    /// reaches the engine after it), fails every pending handle with the
    /// reason and flushes the timeline. Idempotent.
    pub(crate) fn stop(&mut self, reason: Error) {
        if self.stopped.is_some() {
            return;
        }
        let rank = self.engine.rank;
        tracing::debug!(rank, %reason, "kolo engine stopped");
        fail_all(&self.engine.shared, reason.clone());
        self.engine.held.clear();
        self.engine.batches.fail_all(&reason);
        if let Err(e) = self.engine.timeline.flush() {
            tracing::warn!(rank, error = %e, "the timeline could not be written");
        }
        self.stopped = Some(reason);
    }

    /// Ends a cycle of cache hits only. A step that repeats the last one
    /// performed whole ([`Engine::perform_repeat`]) completes before the
    /// coordinator settles its books: the user's next step starts while
    /// this thread finishes the cycle. Otherwise the cycle ends first and
    /// its hits are performed as any cycle's.
    fn repeat_or_perform(&mut self, agreement: Agreement, busy: bool) -> CycleOutput {
        match self
            .engine
            .perform_repeat(&self.coordinator, agreement.slots())
        {
            Some(ids) => {
                let output = self.coordinator.finish_cycle(agreement);
                self.engine.repeated(&self.coordinator, &ids);
                output
            }
            None => {
                let output = self.coordinator.finish_cycle(agreement);
                self.perform_cycle(output, busy)
            }
        }
    }

    /// Counts a whole cycle and performs its responses and hits.
    fn perform_cycle(&mut self, output: CycleOutput, busy: bool) -> CycleOutput {
        self.engine.record_cycle(&output, busy);
        self.engine
            .perform_all(&self.coordinator, &output.responses, &output.hits);
        output
    }

    /// Takes the submissions queued in the tensor table: registers their
    /// new names with the coordinator, holds them, and returns their
    /// requests; ids no longer used are reclaimed.
    fn take_queued(&mut self) -> Result<Intake, Error> {
        let shared = Arc::clone(&self.engine.shared);
        let mut table = shared.table.lock();
        let taken = table.take_queued();
        for (id, name) in &taken.named {
            self.coordinator.register(*id, name).map_err(|e| {
                Error::Transport(TransportError::Backend(format!(
                    "internal: the tensor table's ids disagree with the coordinator's: {e}"
                )))
            })?;
        }
        let requests = self.engine.hold(taken);
        let (held, coordinator) = (&self.engine.held, &mut self.coordinator);
        table.reclaim(|id| {
            held.get(id.index()).is_none_or(Option::is_none) && coordinator.forget(id)
        });
        Ok(requests)
    }
}

impl<B: Backend, D: PlaneSlot> Background<B, D> {
    /// The background thread of `core`, woken through `commands` (whose
    /// sender `wake` also goes to callers that run cycles).
    pub(crate) fn new(
        core: Core<B, D>,
        config: &Config,
        commands: Receiver<Command>,
        wake: Sender<Command>,
        abort: impl FnOnce(&mut B, &str) + Send + 'static,
    ) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let poll = poll_budget(core.engine.backend.local_size(), cores);
        Background {
            shared: Arc::new(Shareable {
                core: Mutex::new(core),
                wake,
            }),
            cycle_time: config.cycle_time,
            poll,
            commands,
            abort: Some(Box::new(abort)),
        }
    }

    /// The state this thread shares with callers that run cycles.
    pub(crate) fn shareable(&self) -> &Arc<Shareable<B, D>> {
        &self.shared
    }

    /// Serves until shutdown, abort or failure, then stops the engine
    /// (failing whatever is still pending) with the reason.
    /// (A panic here is caught by the thread's start, in `crate::engine`,
    /// which fails every handle with its message.)
    pub(crate) fn run(mut self) {
        let reason = self.serve();
        self.shared.core.lock().stop(reason);
    }

    /// The cycle loop; returns why it stopped.
    ///
    /// It waits for a command, or for the cycle time, without the lock;
    /// then runs a cycle if the core is free and there is work to do, a
    /// shutdown to agree on, or an idle cycle due. A caller that holds the
    /// core runs the cycles itself, and wakes this thread if it leaves
    /// work behind.
    fn serve(&mut self) -> Error {
        loop {
            let wait = match self.shared.core.try_lock() {
                Some(core) if core.has_work() => Duration::ZERO,
                Some(core) => self.cycle_time.saturating_sub(core.last_cycle.elapsed()),
                None => self.cycle_time,
            };
            let (shutdown, abort) = self.collect(wait);
            let mut core = if shutdown || abort.is_some() {
                self.shared.core.lock()
            } else {
                match self.shared.core.try_lock() {
                    Some(core) => core,
                    None => continue,
                }
            };
            if let Some(reason) = &core.stopped {
                return reason.clone();
            }
            if let Some(message) = abort {
                if let Some(hook) = self.abort.take() {
                    hook(&mut core.engine.backend, &message);
                }
                return Error::RankFailed {
                    rank: core.engine.rank,
                    message,
                };
            }
            core.shutdown_requested |= shutdown;
            if !(core.has_work() || core.idle_cycle_due(self.cycle_time)) {
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| core.step())) {
                Ok(Ok(())) => {}
                Ok(Err(reason)) => return reason,
                Err(panic) => {
                    // Every handle learns why, before the thread unwinds.
                    let rank = core.rank();
                    core.stop(Error::RankFailed {
                        rank,
                        message: format!(
                            "kolo's background thread panicked: {}",
                            panic_text(panic.as_ref())
                        ),
                    });
                    drop(core);
                    resume_unwind(panic);
                }
            }
        }
    }

    /// Takes the commands waiting, blocking up to `wait` for the first one
    /// when there are none: whether a shutdown was asked, and an abort
    /// message.
    ///
    /// While this rank has requests the other ranks have not all agreed to
    /// yet, `wait` is zero: its peers' submissions wake *their* engines,
    /// not this one, and a peer whose next cycle waits in the coordinator's
    /// collective for this rank would otherwise wait out this rank's cycle
    /// time (up to 1 ms per step). The next cycle's collective itself waits
    /// for the peers (spinning briefly, then yielding, then sleeping).
    fn collect(&mut self, wait: Duration) -> (bool, Option<String>) {
        let mut shutdown = false;
        let first = if let Some(command) = self.poll_commands(wait) {
            Some(command)
        } else {
            match self.commands.recv_timeout(wait.saturating_sub(self.poll)) {
                Ok(command) => Some(command),
                Err(RecvTimeoutError::Timeout) => None,
                // `Kolo` is gone without a shutdown request: treat it as one.
                Err(RecvTimeoutError::Disconnected) => {
                    shutdown = true;
                    None
                }
            }
        };
        let mut abort = None;
        for command in first.into_iter().chain(self.commands.try_iter()) {
            match command {
                Command::Wake => {}
                Command::Shutdown => shutdown = true,
                Command::Abort(message) => abort = Some(message),
            }
        }
        (shutdown, abort)
    }

    /// Polls the channel, yielding the CPU, for up to the poll budget
    /// (at most `wait`): a rank that submits its next tensor right after
    /// the last completed (a training step's next gradient, a latency
    /// loop) then reaches an engine that is still awake, instead of paying
    /// a futex wake-up and a context switch.
    fn poll_commands(&self, wait: Duration) -> Option<Command> {
        let budget = wait.min(self.poll);
        let start = Instant::now();
        loop {
            match self.commands.try_recv() {
                Ok(command) => return Some(command),
                Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
                Err(crossbeam_channel::TryRecvError::Empty) => {}
            }
            if start.elapsed() >= budget {
                return None;
            }
            std::thread::yield_now();
        }
    }
}

impl<B: Backend, D: PlaneSlot> Engine<B, D> {
    /// Holds the submissions taken from the table and returns their
    /// requests, in order.
    fn hold(&mut self, taken: Taken) -> Intake {
        // A repeated group alone (a training step that repeats the last)
        // goes to the coordinator as one.
        let group = match taken.submissions.as_slice() {
            [q] if matches!(q.requests, Requests::Repeat) => Some(Arc::clone(&q.ids)),
            _ => None,
        };
        let tensors = match group {
            Some(_) => 0,
            None => taken.submissions.iter().map(|q| q.ids.len()).sum(),
        };
        let mut requests = Vec::with_capacity(tensors);
        for mut q in taken.submissions {
            if group.is_none() {
                for index in 0..q.ids.len() {
                    requests.push(q.submission(index));
                }
            }
            let ids = Arc::clone(&q.ids);
            let key = self.batches.add(q.completion, Arc::clone(&ids), q.inputs);
            for (index, id) in ids.iter().enumerate() {
                if self.held.len() <= id.index() {
                    self.held.resize(id.index() + 1, None);
                }
                // The table refuses a name in flight, so the place is free;
                // if not (a kolo bug), the part replaced fails when its
                // submission is dropped.
                self.held[id.index()] = Some(Batches::part(key, index as u32));
            }
        }
        match group {
            Some(ids) => Intake::Group(ids),
            None => Intake::Each(requests),
        }
    }

    /// Counts the cycle and writes its negotiation to the timeline.
    fn record_cycle(&self, output: &CycleOutput, busy: bool) {
        self.shared
            .stats
            .lock()
            .record_cycle(output.stats.gathered, output.stats.cache_hits);
        if !self.timeline.is_enabled() {
            return;
        }
        // Idle cycles are not marked: they would drown the trace.
        let answered = !output.responses.is_empty() || !output.hits.is_empty();
        if busy || answered || !output.events.is_empty() {
            self.timeline.mark_cycle();
        }
        for event in &output.events {
            match event {
                NegotiationEvent::Start { tensor, kind } => {
                    self.timeline.negotiate_start(tensor, kind.name())
                }
                NegotiationEvent::RankReady { tensor, rank } => {
                    self.timeline.negotiate_rank_ready(tensor, *rank)
                }
                NegotiationEvent::End { tensor } => self.timeline.negotiate_end(tensor),
            }
        }
    }

    /// Performs the responses of one cycle in order — rank 0's, then the
    /// cache hits (whose responses `coordinator`'s cache keeps until the
    /// next cycle) — fused (a pure plan every rank computes alike, see
    /// [`kolo_fusion::plan_groups`]). On the timeline every tensor's
    /// operation opens when the cycle's responses arrive and waits in
    /// `QUEUE` until its response runs.
    fn perform_all(&mut self, coordinator: &Coordinator, decided: &[Agreed], hits: &[Hit]) {
        let cache = coordinator.cache();
        let mut work: Vec<Work<'_>> = Vec::with_capacity(decided.len() + hits.len());
        work.extend(decided.iter().map(|a| Work {
            response: &a.response,
            id: a.id,
        }));
        work.extend(hits.iter().filter_map(|hit| {
            cache.response(hit.slot).map(|response| Work {
                response,
                id: hit.id,
            })
        }));
        if self.timeline.is_enabled() {
            for w in &work {
                if let ResponseKind::Op(kind) = w.response.kind {
                    for name in &w.response.tensor_names {
                        self.timeline.op_start(name, kind.name());
                        self.timeline.activity_start(name, activity::QUEUE);
                    }
                }
            }
        }
        let repeated = decided.is_empty()
            && self.plan.generation == cache.generation()
            && self.plan.slots.len() == hits.len()
            && self.plan.slots.iter().zip(hits).all(|(&s, h)| s == h.slot);
        let plan = match self.plan.plan.take() {
            Some(plan) if repeated => plan,
            _ => {
                let refs: Vec<&Response> = work.iter().map(|w| w.response).collect();
                kolo_fusion::plan_groups(&refs, self.fusion_threshold)
            }
        };
        let mut whole = None;
        for members in plan.groups() {
            whole = self.perform(coordinator, &work, members);
        }
        let one_group = {
            let mut groups = plan.groups();
            matches!((groups.next(), groups.next()), (Some(g), None) if g.len() == work.len())
        };
        self.plan.whole = whole.filter(|_| decided.is_empty() && one_group);
        if decided.is_empty() {
            self.plan.slots.clear();
            self.plan.slots.extend(hits.iter().map(|h| h.slot));
            self.plan.generation = cache.generation();
            self.plan.plan = Some(plan);
        }
    }

    /// Performs a cycle agreed on cache `slots` alone, before the
    /// coordinator settles it, if it repeats the last cycle's plan of one
    /// allreduce over one whole submission (see [`PlanMemo`]) and that
    /// submission is held whole again; returns its ids, whose hold
    /// [`Engine::repeated`] clears once the cycle is settled. `None` (the
    /// cycle is not such a repeat) performs nothing.
    ///
    /// Every rank's agreement names the same slots; whether a rank takes
    /// this path is its own business: the collective is the one
    /// [`Engine::perform_all`] runs for the same group.
    fn perform_repeat(
        &mut self,
        coordinator: &Coordinator,
        slots: &[usize],
    ) -> Option<Arc<[TensorId]>> {
        let cache = coordinator.cache();
        let ids = self.plan.whole.as_ref()?;
        if self.timeline.is_enabled()
            || self.plan.generation != cache.generation()
            || self.plan.slots != slots
            || ids.len() != slots.len()
        {
            return None;
        }
        let (key, _) = Batches::locate((*self.held.get(ids.first()?.index())?)?);
        if !Arc::ptr_eq(self.batches.ids(key)?, ids) {
            return None;
        }
        let head = cache.response(*slots.first()?)?;
        if head.kind != ResponseKind::Op(RequestKind::Allreduce) || crate::device::on_device(head) {
            return None;
        }
        let ids = Arc::clone(ids);
        let whole = self.batches.claim_whole(key, ids.len())?;
        {
            // The cycle as `record_cycle` counts it once settled (all
            // hits, nothing gathered), and its one operation.
            let mut stats = self.shared.stats.lock();
            stats.record_cycle(false, slots.len());
            stats.record_operation(slots.len());
        }
        with_element_type!(head.dtype, T => self.allreduce_whole::<T>(head, whole));
        Some(ids)
    }

    /// After a cycle [`Engine::perform_repeat`] performed and the
    /// coordinator settled: the group's tensors leave the hold, and the
    /// plan stays memoized against the cache as it now is.
    fn repeated(&mut self, coordinator: &Coordinator, ids: &[TensorId]) {
        for id in ids {
            if let Some(held) = self.held.get_mut(id.index()) {
                *held = None;
            }
        }
        self.plan.generation = coordinator.cache().generation();
    }

    /// Takes this rank's entries for the tensors of `members` out of the
    /// engine's hold, in order (`None` where this rank has none).
    fn take_entries(&mut self, work: &[Work<'_>], members: &[usize]) -> Vec<Option<Entry>> {
        let mut slots = Vec::with_capacity(members.len());
        for &m in members {
            let w = &work[m];
            // An id comes only with a single-tensor response (see
            // `kolo_coordinator::Agreed`): its response is not read.
            match (w.id, w.response) {
                (Some(id), _) => slots.push(self.take_entry(id)),
                (None, response) => {
                    let names = &response.tensor_names;
                    // A join (several names), or a name this rank's
                    // coordinator did not settle: by name.
                    let ids: Vec<Option<TensorId>> = {
                        let table = self.shared.table.lock();
                        names.iter().map(|name| table.id(name)).collect()
                    };
                    for id in ids {
                        slots.push(id.and_then(|id| self.take_entry(id)));
                    }
                }
            }
        }
        slots
    }

    /// The submission whose tensors `members` are, all of them in order,
    /// if they are one whole submission none of whose tensors was
    /// performed yet (a repeated group settled by the cache: then its
    /// fused allreduce runs straight over the submission's lent memory).
    /// The tensors are taken from the hold.
    fn whole_submission(&mut self, work: &[Work<'_>], members: &[usize]) -> Option<Whole> {
        let first = work[*members.first()?].id?;
        let (key, _) = Batches::locate((*self.held.get(first.index())?)?);
        for (position, &m) in members.iter().enumerate() {
            let id = work[m].id?;
            let part = (*self.held.get(id.index())?)?;
            if Batches::locate(part) != (key, position as u32) {
                return None;
            }
        }
        // Every member is part `position` of the submission; claiming it
        // whole checks that they are all of its parts and none is done.
        let whole = self.batches.claim_whole(key, members.len())?;
        for &m in members {
            if let Some(held) = work[m].id.and_then(|id| self.held.get_mut(id.index())) {
                *held = None;
            }
        }
        Some(whole)
    }

    /// The tensor `id` this rank holds.
    fn take_entry(&mut self, id: TensorId) -> Option<Entry> {
        let part = self.held.get_mut(id.index())?.take()?;
        Some(Entry {
            id,
            input: self.batches.take_input(part),
            part,
        })
    }

    /// Performs one group of the plan: fails its tensors, or runs its
    /// collective. Returns the submission's ids when the group ran as one
    /// allreduce over a whole submission.
    fn perform(
        &mut self,
        coordinator: &Coordinator,
        work: &[Work<'_>],
        members: &[usize],
    ) -> Option<Arc<[TensorId]>> {
        let head = members.first().map(|&m| work[m].response)?;
        // A repeated group: one fused allreduce over one whole submission
        // of lent tensors, without reading the other responses.
        let fused_allreduce = head.kind == ResponseKind::Op(RequestKind::Allreduce);
        if fused_allreduce && !self.timeline.is_enabled() && !crate::device::on_device(head) {
            if let Some(whole) = self.whole_submission(work, members) {
                let ids = self.batches.ids(whole.key()).map(Arc::clone);
                self.shared.stats.lock().record_operation(members.len());
                with_element_type!(head.dtype, T => self.allreduce_whole::<T>(head, whole));
                return ids;
            }
        }
        let parts: Vec<&Response> = members.iter().map(|&m| work[m].response).collect();
        let ResponseKind::Op(kind) = head.kind else {
            for &m in members {
                self.fail_tensors(&work[m]);
            }
            return None;
        };
        let names: Vec<&str> = if self.timeline.is_enabled() {
            parts
                .iter()
                .flat_map(|r| r.tensor_names.iter().map(String::as_str))
                .collect()
        } else {
            Vec::new()
        };
        self.timeline.activity_end_all(&names);
        let slots = self.take_entries(work, members);
        if kind != RequestKind::Join {
            self.shared.stats.lock().record_operation(slots.len());
        }
        tracing::trace!(rank = self.rank, %kind, tensors = slots.len(), "performing");
        let params = ParamsOf(coordinator);
        if crate::device::on_device(head) {
            let fused = kolo_fusion::fuse(&parts);
            self.perform_device(kind, &fused, slots, params);
            return None;
        }
        match kind {
            RequestKind::Allreduce => {
                with_element_type!(head.dtype, T => self.allreduce::<T>(&parts, &names, slots, params))
            }
            RequestKind::ReduceScatter => {
                let r = &kolo_fusion::fuse(&parts);
                with_element_type!(r.dtype, T => self.reduce_scatter::<T>(r, slots, params))
            }
            RequestKind::Allgather => {
                let r = &kolo_fusion::fuse(&parts);
                with_element_type!(r.dtype, T => self.allgather::<T>(r, slots, params))
            }
            RequestKind::Broadcast => {
                let r = &kolo_fusion::fuse(&parts);
                with_element_type!(r.dtype, T => self.broadcast::<T>(r, slots, params))
            }
            RequestKind::Alltoall => {
                let r = &kolo_fusion::fuse(&parts);
                with_element_type!(r.dtype, T => self.alltoall::<T>(r, slots, params))
            }
            RequestKind::Barrier | RequestKind::Join => {
                // The negotiation itself gathered every rank for a join; a
                // barrier also runs the backend's.
                let result = match kind {
                    RequestKind::Barrier => self.backend.barrier().map_err(Error::from_transport),
                    _ => Ok(()),
                };
                let names = parts.iter().flat_map(|r| r.tensor_names.iter());
                let mut done = Vec::with_capacity(slots.len());
                for (name, slot) in names.zip(slots) {
                    self.timeline.op_end(name, "", &[]);
                    if let Some(entry) = slot {
                        done.push((entry.part, result.clone().map(|()| Box::new(()) as Payload)));
                    }
                }
                self.batches.complete(done);
            }
        }
        None
    }

    /// Fails the tensors of an error response with its message.
    fn fail_tensors(&mut self, w: &Work<'_>) {
        let slots = self.take_entries(std::slice::from_ref(w), &[0]);
        let response = w.response;
        self.shared.stats.lock().failed_tensors += response.tensor_names.len() as u64;
        let mut done = Vec::with_capacity(slots.len());
        for (name, slot) in response.tensor_names.iter().zip(slots) {
            tracing::debug!(rank = self.rank, tensor = %name, message = %response.error_message, "tensor failed");
            if let Some(entry) = slot {
                done.push((
                    entry.part,
                    Err(Error::from_response(name, &response.error_message)),
                ));
            }
        }
        self.batches.complete(done);
    }

    /// Ends `name`'s operation: the timeline's span closes with its dtype
    /// and output shape, and the handle (if this rank submitted the tensor)
    /// completes with `result`.
    pub(crate) fn finish(
        &mut self,
        name: &str,
        slot: Option<Entry>,
        result: Result<Payload, Error>,
        dtype: DataType,
        shape: &[u64],
    ) {
        self.timeline.op_end(name, dtype.name(), shape);
        if let Some(entry) = slot {
            self.batches.complete([(entry.part, result)]);
        }
    }
}

/// Records the phases of a fused operation on `names` as timeline
/// activities, naming the collective phase `collective`.
pub(crate) fn observer<'t>(
    timeline: &'t Timeline,
    names: &'t [&'t str],
    collective: &'static str,
) -> impl FnMut(Phase, Edge) + 't {
    move |phase, edge| match edge {
        Edge::Start => timeline.activity_start_all(
            names,
            match phase {
                Phase::MemcpyInFusionBuffer => activity::MEMCPY_IN_FUSION_BUFFER,
                Phase::Collective => collective,
                Phase::MemcpyOutFusionBuffer => activity::MEMCPY_OUT_FUSION_BUFFER,
            },
        ),
        Edge::End => timeline.activity_end_all(names),
    }
}

/// Moves the engine's copy of the input out of `slot`. An input of another
/// type than the response's (a kolo bug) fails the entry and reads as
/// absent, so that this rank still takes part in the collective.
pub(crate) fn take_input<T: Element>(
    name: &str,
    slot: &mut Option<Entry>,
    failed: &mut Vec<(PartRef, Result<Payload, Error>)>,
) -> Option<Vec<T>> {
    let entry = slot.as_mut()?;
    let problem = match std::mem::replace(&mut entry.input, Input::None) {
        Input::Owned(payload) => match payload.downcast::<Vec<T>>() {
            Ok(data) => return Some(*data),
            Err(_) => format!("internal: the input is not of the agreed type {}", T::DTYPE),
        },
        // Only allreduces are lent (see `crate::scope`).
        Input::Lent(_) => {
            "internal: a lent tensor reached an operation other than allreduce".to_owned()
        }
        Input::None => "internal: the tensor has no input".to_owned(),
    };
    // The caller completes the tensor with the failure (its slot is
    // emptied, so it takes part as absent).
    if let Some(entry) = slot.take() {
        failed.push((
            entry.part,
            Err(Error::Collective {
                tensor: name.to_owned(),
                message: problem,
            }),
        ));
    }
    None
}

/// An element count from the protocol as `usize` (0 if it does not fit:
/// such a response cannot be performed on this machine anyway).
pub(crate) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_polls_long_only_where_every_thread_has_a_core() {
        // Each rank has two threads on its host: its caller and its engine.
        assert_eq!(poll_budget(1, 2), LONG_POLL);
        assert_eq!(poll_budget(2, 2), SHORT_POLL);
        assert_eq!(poll_budget(2, 16), LONG_POLL);
        assert_eq!(poll_budget(8, 16), LONG_POLL);
        assert_eq!(poll_budget(9, 16), SHORT_POLL);
        assert_eq!(poll_budget(1, 1), SHORT_POLL);
        assert_eq!(poll_budget(usize::MAX, 16), SHORT_POLL);
        assert!(SHORT_POLL < LONG_POLL);
    }
}
