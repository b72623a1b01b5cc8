//! The background thread of a rank: owns the backend, runs the
//! coordinator's cycle, and performs the agreed responses in order.
//!
//! It sleeps on the command channel: a submission wakes it at once (a busy
//! rank cycles right away), and an idle rank cycles anyway after the cycle
//! time, so that peers' collectives complete and the stall inspector runs.

use crate::config::Config;
use crate::device::DevicePlane;
use crate::engine::Shared;
use crate::error::Error;
use crate::handle::Payload;
use crate::table::{Entry, Held, Input};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use kolo_coordinator::{
    Agreed, Coordinator, CoordinatorError, CycleOutput, NegotiationEvent, Submission, TensorId,
};
use kolo_fusion::{Edge, FusionBuffers, Phase};
use kolo_protocol::{DataType, Params, RequestKind, Response, ResponseKind};
use kolo_timeline::{activity, Timeline};
use kolo_transport::{with_element_type, Backend, Element, TransportError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the background thread polls for new work, yielding the CPU,
/// before it sleeps on the channel.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// What user threads tell the background thread.
pub(crate) enum Command {
    /// New requests are queued in the tensor table.
    Wake,
    /// Ask every rank to shut down.
    Shutdown,
    /// Stop at once, as failed, with this message.
    Abort(String),
}

/// Fails the backend when the rank aborts.
type AbortHook<B> = Box<dyn FnOnce(&mut B, &str) + Send>;

/// One rank's engine; lives on the background thread.
pub(crate) struct Engine<B> {
    pub(crate) backend: B,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    coordinator: Coordinator,
    fusion_threshold: usize,
    cycle_time: Duration,
    pub(crate) buffers: FusionBuffers,
    pub(crate) timeline: Timeline,
    pub(crate) shared: Arc<Shared>,
    commands: Receiver<Command>,
    abort: Option<AbortHook<B>>,
    shutdown_requested: bool,
    /// The GPU data plane, serving responses on device tensors.
    pub(crate) device: Option<Box<dyn DevicePlane>>,
    /// The tensors taken from the table's queue and not performed yet, by
    /// id (this thread's side of the table).
    held: Vec<Option<Held>>,
}

/// Closes the tensor table if the background thread unwinds, so that no
/// handle waits forever on a dead engine.
struct CloseOnUnwind {
    shared: Arc<Shared>,
    rank: usize,
}

impl Drop for CloseOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            fail_all(
                &self.shared,
                Error::RankFailed {
                    rank: self.rank,
                    message: "kolo's background thread panicked".into(),
                },
            );
        }
    }
}

/// Closes the table with `reason` and fails every entry still in flight.
fn fail_all(shared: &Shared, reason: Error) {
    let entries = shared.table.lock().close(reason.clone());
    crate::handle::complete_all(
        entries
            .into_iter()
            .map(|held| (held.part, Err(reason.clone()))),
    );
}

impl<B: Backend> Engine<B> {
    pub(crate) fn new(
        backend: B,
        config: &Config,
        timeline: Timeline,
        shared: Arc<Shared>,
        commands: Receiver<Command>,
        abort: impl FnOnce(&mut B, &str) + Send + 'static,
    ) -> Self {
        let (rank, size) = (backend.rank(), backend.size());
        Engine {
            backend,
            rank,
            size,
            coordinator: Coordinator::new(rank, size, config.coordinator()),
            fusion_threshold: config.fusion_threshold,
            cycle_time: config.cycle_time,
            buffers: FusionBuffers::new(),
            timeline,
            shared,
            commands,
            abort: Some(Box::new(abort)),
            shutdown_requested: false,
            device: None,
            held: Vec::new(),
        }
    }

    /// Serves until shutdown, abort or failure, then fails whatever is
    /// still pending with the reason.
    pub(crate) fn run(mut self) {
        let _guard = CloseOnUnwind {
            shared: Arc::clone(&self.shared),
            rank: self.rank,
        };
        let reason = self.serve();
        tracing::debug!(rank = self.rank, %reason, "kolo engine stopped");
        // Close the table first: nothing new reaches `held` after it.
        fail_all(&self.shared, reason.clone());
        crate::handle::complete_all(
            std::mem::take(&mut self.held)
                .into_iter()
                .flatten()
                .map(|held| (held.part, Err(reason.clone()))),
        );
        if let Err(e) = self.timeline.flush() {
            tracing::warn!(rank = self.rank, error = %e, "the timeline could not be written");
        }
    }

    /// The cycle loop; returns why it stopped.
    fn serve(&mut self) -> Error {
        loop {
            let (requests, abort) = match self.collect() {
                Ok(collected) => collected,
                Err(e) => return e,
            };
            if let Some(message) = abort {
                if let Some(hook) = self.abort.take() {
                    hook(&mut self.backend, &message);
                }
                return Error::RankFailed {
                    rank: self.rank,
                    message,
                };
            }
            let busy = !requests.is_empty();
            let output = match self.coordinator.cycle(
                &mut self.backend,
                requests,
                self.shutdown_requested,
                Instant::now(),
            ) {
                Ok(output) => output,
                Err(CoordinatorError::Transport(e)) => return Error::from_transport(e),
                Err(other) => {
                    return Error::Transport(kolo_transport::TransportError::Backend(
                        other.to_string(),
                    ))
                }
            };
            self.record_cycle(&output, busy);
            let CycleOutput {
                responses,
                shutdown,
                shutdown_ranks,
                ..
            } = output;
            self.perform_all(responses);
            if shutdown {
                return Error::ShutDown {
                    by_ranks: shutdown_ranks,
                };
            }
        }
    }

    /// Takes the commands waiting, blocking up to the cycle time for the
    /// first one when there are none: the requests, and an abort message.
    ///
    /// While this rank has requests the other ranks have not all agreed to
    /// yet, it does not block: its peers' submissions wake *their* engines,
    /// not this one, and a peer whose next cycle waits in the coordinator's
    /// collective for this rank would otherwise wait out this rank's cycle
    /// time (up to 1 ms per step). The next cycle's collective itself waits
    /// for the peers (spinning briefly, then yielding, then sleeping).
    fn collect(&mut self) -> Result<(Vec<Submission>, Option<String>), Error> {
        let wait = if self.coordinator.pending() > 0 {
            Duration::ZERO
        } else {
            self.cycle_time
        };
        let first = if self.shutdown_requested {
            None
        } else if let Some(command) = self.poll_commands(wait) {
            Some(command)
        } else {
            match self
                .commands
                .recv_timeout(wait.saturating_sub(POLL_BEFORE_SLEEP))
            {
                Ok(command) => Some(command),
                Err(RecvTimeoutError::Timeout) => None,
                // `Kolo` is gone without a shutdown request: treat it as one.
                Err(RecvTimeoutError::Disconnected) => {
                    self.shutdown_requested = true;
                    None
                }
            }
        };
        let mut abort = None;
        for command in first.into_iter().chain(self.commands.try_iter()) {
            match command {
                Command::Wake => {}
                Command::Shutdown => self.shutdown_requested = true,
                Command::Abort(message) => abort = Some(message),
            }
        }
        // After the commands: a submitter queues before it sends its wake.
        let shared = Arc::clone(&self.shared);
        let mut table = shared.table.lock();
        let (queued, named) = table.take_queued();
        for (id, name) in named {
            self.coordinator.register(id, &name).map_err(|e| {
                Error::Transport(TransportError::Backend(format!(
                    "internal: the tensor table's ids disagree with the coordinator's: {e}"
                )))
            })?;
        }
        let mut requests = Vec::with_capacity(queued.len());
        for q in queued {
            let id = q.submission.id;
            if self.held.len() <= id.index() {
                self.held.resize_with(id.index() + 1, || None);
            }
            // The table refuses a name in flight, so the slot is free; if
            // not (a kolo bug), the newcomer fails when it is replaced.
            self.held[id.index()] = Some(q.held);
            requests.push(q.submission);
        }
        let (held, coordinator) = (&self.held, &mut self.coordinator);
        table.reclaim(|id| {
            held.get(id.index()).is_none_or(Option::is_none) && coordinator.forget(id)
        });
        Ok((requests, abort))
    }

    /// Polls the channel, yielding the CPU, for up to [`POLL_BEFORE_SLEEP`]
    /// (at most `wait`): a rank that submits its next tensor right after
    /// the last completed (a training step's next gradient, a latency
    /// loop) then reaches an engine that is still awake, instead of paying
    /// a futex wake-up and a context switch.
    fn poll_commands(&self, wait: Duration) -> Option<Command> {
        let budget = wait.min(POLL_BEFORE_SLEEP);
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

    /// Counts the cycle and writes its negotiation to the timeline.
    fn record_cycle(&self, output: &CycleOutput, busy: bool) {
        {
            let mut stats = self.shared.stats.lock();
            stats.cycles += 1;
            stats.gathered_cycles += u64::from(output.stats.gathered);
            stats.cache_hits += output.stats.cache_hits as u64;
        }
        if !self.timeline.is_enabled() {
            return;
        }
        // Idle cycles are not marked: they would drown the trace.
        if busy || !output.responses.is_empty() || !output.events.is_empty() {
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

    /// Performs the responses of one cycle in order, fused (a pure plan
    /// every rank computes alike, see [`kolo_fusion::plan_groups`]). On
    /// the timeline every tensor's operation opens when the cycle's
    /// responses arrive and waits in `QUEUE` until its response runs.
    fn perform_all(&mut self, responses: Vec<Agreed>) {
        if self.timeline.is_enabled() {
            for response in &responses {
                if let ResponseKind::Op(kind) = response.kind {
                    for name in &response.tensor_names {
                        self.timeline.op_start(name, kind.name());
                        self.timeline.activity_start(name, activity::QUEUE);
                    }
                }
            }
        }
        let refs: Vec<&Response> = responses.iter().map(|a| &*a.response).collect();
        let plan = kolo_fusion::plan_groups(&refs, self.fusion_threshold);
        for members in plan.groups() {
            self.perform(&responses, members);
        }
    }

    /// Takes this rank's entries for the tensors of `members` out of the
    /// table, in order (`None` where this rank has none).
    fn take_entries(&mut self, responses: &[Agreed], members: &[usize]) -> Vec<Option<Entry>> {
        let mut slots = Vec::with_capacity(members.len());
        for &m in members {
            let agreed = &responses[m];
            match (agreed.id, agreed.tensor_names.as_slice()) {
                (Some(id), [_]) => slots.push(self.take_entry(id)),
                (_, names) => {
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

    /// The tensor `id` this rank holds, with its parameters.
    fn take_entry(&mut self, id: TensorId) -> Option<Entry> {
        let held = self.held.get_mut(id.index())?.take()?;
        let params = self.coordinator.params(id).cloned().unwrap_or_else(|| {
            // Every submission reaches the coordinator before its
            // response: a kolo bug if not (the parameters serve the
            // timeline and the device only).
            Params::new(RequestKind::Barrier, DataType::U8, [])
        });
        Some(Entry {
            params,
            input: held.input,
            part: held.part,
        })
    }

    /// Performs one group of the plan: fails its tensors, or runs its
    /// collective.
    fn perform(&mut self, responses: &[Agreed], members: &[usize]) {
        let parts: Vec<&Response> = members.iter().map(|&m| &*responses[m].response).collect();
        let Some(&head) = parts.first() else {
            return;
        };
        let ResponseKind::Op(kind) = head.kind else {
            for &m in members {
                self.fail_tensors(&responses[m]);
            }
            return;
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
        let slots = self.take_entries(responses, members);
        if kind != RequestKind::Join {
            self.shared.stats.lock().record_operation(slots.len());
        }
        tracing::trace!(rank = self.rank, %kind, tensors = slots.len(), "performing");
        if crate::device::on_device(head) {
            let fused = kolo_fusion::fuse(&parts);
            self.perform_device(kind, &fused, slots);
            return;
        }
        match kind {
            RequestKind::Allreduce => {
                with_element_type!(head.dtype, T => self.allreduce::<T>(&parts, &names, slots))
            }
            RequestKind::ReduceScatter => {
                let r = &kolo_fusion::fuse(&parts);
                with_element_type!(r.dtype, T => self.reduce_scatter::<T>(r, slots))
            }
            RequestKind::Allgather => {
                let r = &kolo_fusion::fuse(&parts);
                with_element_type!(r.dtype, T => self.allgather::<T>(r, slots))
            }
            RequestKind::Broadcast => {
                let r = &kolo_fusion::fuse(&parts);
                with_element_type!(r.dtype, T => self.broadcast::<T>(r, slots))
            }
            RequestKind::Alltoall => {
                let r = &kolo_fusion::fuse(&parts);
                with_element_type!(r.dtype, T => self.alltoall::<T>(r, slots))
            }
            RequestKind::Barrier | RequestKind::Join => {
                // The negotiation itself gathered every rank for a join; a
                // barrier also runs the backend's.
                let result = match kind {
                    RequestKind::Barrier => self.backend.barrier().map_err(Error::from_transport),
                    _ => Ok(()),
                };
                let names = parts.iter().flat_map(|r| r.tensor_names.iter());
                for (name, slot) in names.zip(slots) {
                    self.timeline.op_end(name, "", &[]);
                    if let Some(entry) = slot {
                        entry.complete(result.clone().map(|()| Box::new(()) as Payload));
                    }
                }
            }
        }
    }

    /// Fails the tensors of an error response with its message.
    fn fail_tensors(&mut self, agreed: &Agreed) {
        let slots = self.take_entries(std::slice::from_ref(agreed), &[0]);
        let mut stats = self.shared.stats.lock();
        stats.failed_tensors += agreed.tensor_names.len() as u64;
        drop(stats);
        for (name, slot) in agreed.tensor_names.iter().zip(slots) {
            tracing::debug!(rank = self.rank, tensor = %name, message = %agreed.error_message, "tensor failed");
            if let Some(entry) = slot {
                entry.complete(Err(Error::from_response(name, &agreed.error_message)));
            }
        }
    }

    /// Ends `name`'s operation: the timeline's span closes with its dtype
    /// and output shape, and the handle (if this rank submitted the tensor)
    /// completes with `result`.
    pub(crate) fn finish(
        &self,
        name: &str,
        slot: Option<Entry>,
        result: Result<Payload, Error>,
        dtype: DataType,
        shape: &[u64],
    ) {
        self.timeline.op_end(name, dtype.name(), shape);
        if let Some(entry) = slot {
            entry.complete(result);
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
pub(crate) fn take_input<T: Element>(name: &str, slot: &mut Option<Entry>) -> Option<Vec<T>> {
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
    if let Some(entry) = slot.take() {
        entry.complete(Err(Error::Collective {
            tensor: name.to_owned(),
            message: problem,
        }));
    }
    None
}

/// An element count from the protocol as `usize` (0 if it does not fit:
/// such a response cannot be performed on this machine anyway).
pub(crate) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(0)
}
