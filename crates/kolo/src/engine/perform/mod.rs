//! Performing agreed responses on the backend, one dtype at a time
//! (`T` is chosen by the background thread's dtype dispatch).
//!
//! Every rank calls the same collective with the same sizes whether or not
//! it submitted the tensor: a rank that joined contributes the reduce op's
//! identity (allreduce, reduce-scatter), zero rows (allgather, alltoall) or
//! a placeholder to receive into (broadcast), and its result is dropped.

mod device;
mod gather;
mod hold;
mod reduce;

use crate::engine::batches::{Batches, Order, PartRef};
use crate::engine::completion::Payload;
use crate::engine::placement::PlaneSlot;
use crate::engine::shared::Shared;
use crate::engine::submission::Input;
use crate::engine::table::Entry;
use crate::error::Error;
use kolo_coordinator::{Agreed, Coordinator, CycleOutput, Hit, NegotiationEvent, TensorId};
use kolo_fusion::{Edge, FusionBuffers, Phase};
use kolo_protocol::{DataType, Device, Params, RequestKind, Response, ResponseKind};
use kolo_timeline::{activity, Timeline};
use kolo_transport::{with_element_type, Backend, Element};
use std::sync::Arc;

/// The device of this rank's tensors in a response (CPU for a rank that
/// submitted none of them).
fn device_of(slots: &[Option<Entry>], params: ParamsOf<'_>) -> Device {
    slots
        .iter()
        .flatten()
        .find_map(|e| params.of(e).map(|p| p.device))
        .unwrap_or(Device::Cpu)
}

/// What performs the agreed responses: the backend, the fusion buffers,
/// the timeline, and the tensors taken from the table (this thread's side
/// of it).
pub(crate) struct Performer<B, D> {
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
    pub(super) held: Vec<Option<PartRef>>,
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
/// holding it keeps the pointer from being reused) and the order of its
/// parts in the collective: a later cycle agreeing on the same slots,
/// with that group held whole again, is performed before the coordinator
/// settles its books (see [`Core::step`]).
#[derive(Default)]
struct PlanMemo {
    slots: Vec<usize>,
    generation: u64,
    plan: Option<kolo_fusion::FusionPlan>,
    whole: Option<(Arc<[TensorId]>, Order)>,
}

impl<B: Backend, D: PlaneSlot> Performer<B, D> {
    /// The performer of a rank's engine on `backend`, fusing up to
    /// `fusion_threshold` bytes, with the device plane `device`.
    pub(crate) fn new(
        backend: B,
        fusion_threshold: usize,
        timeline: Timeline,
        shared: Arc<Shared>,
        device: D,
    ) -> Self {
        let (rank, size) = (backend.rank(), backend.size());
        Performer {
            backend,
            rank,
            size,
            fusion_threshold,
            // Room for the largest fused response in two dtypes at once
            // (fp16 and fp32 gradients) without replacing either.
            buffers: FusionBuffers::with_budget(fusion_threshold.saturating_mul(2)),
            timeline,
            shared,
            device,
            held: Vec::new(),
            batches: Batches::default(),
            plan: PlanMemo::default(),
        }
    }

    /// Fuses up to `bytes` from the next cycle on (the autotuner's
    /// setting; every rank changes it at the same cycle). The memoized plan
    /// was made with the old threshold: it goes.
    pub(crate) fn set_fusion_threshold(&mut self, bytes: usize) {
        if bytes != self.fusion_threshold {
            self.fusion_threshold = bytes;
            self.plan = PlanMemo::default();
        }
    }

    /// Counts the cycle and writes its negotiation to the timeline.
    pub(super) fn record_cycle(&self, output: &CycleOutput, busy: bool) {
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
    pub(super) fn perform_all(
        &mut self,
        coordinator: &Coordinator,
        decided: &[Agreed],
        hits: &[Hit],
    ) {
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
    /// [`Performer::repeated`] clears once the cycle is settled. `None` (the
    /// cycle is not such a repeat) performs nothing.
    ///
    /// Every rank's agreement names the same slots; whether a rank takes
    /// this path is its own business: the collective is the one
    /// [`Performer::perform_all`] runs for the same group.
    pub(super) fn perform_repeat(
        &mut self,
        coordinator: &Coordinator,
        slots: &[usize],
    ) -> Option<Arc<[TensorId]>> {
        let cache = coordinator.cache();
        let (ids, order) = self.plan.whole.as_ref()?;
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
        if head.kind != ResponseKind::Op(RequestKind::Allreduce) || !self.whole_served(head) {
            return None;
        }
        let ids = Arc::clone(ids);
        let whole = self.batches.claim_whole(key, ids.len(), order.clone())?;
        {
            // The cycle as `record_cycle` counts it once settled (all
            // hits, nothing gathered), and its one operation.
            let mut stats = self.shared.stats.lock();
            stats.record_cycle(false, slots.len());
            stats.record_operation(slots.len());
        }
        self.perform_whole(head, whole);
        Some(ids)
    }

    /// Counts one operation of `tensors` tensors, and the fusion buffers
    /// held as the operations before it left them.
    fn record_operation(&self, tensors: usize) {
        let mut stats = self.shared.stats.lock();
        stats.record_operation(tensors);
        stats.fusion_buffer_bytes = self.buffers.bytes_allocated() as u64;
    }

    /// After a cycle [`Performer::perform_repeat`] performed and the
    /// coordinator settled: the group's tensors leave the hold, and the
    /// plan stays memoized against the cache as it now is.
    pub(super) fn repeated(&mut self, coordinator: &Coordinator, ids: &[TensorId]) {
        for id in ids {
            if let Some(held) = self.held.get_mut(id.index()) {
                *held = None;
            }
        }
        self.plan.generation = coordinator.cache().generation();
    }

    /// Performs one group of the plan: fails its tensors, or runs its
    /// collective. Returns the submission's ids when the group ran as one
    /// allreduce over a whole submission.
    fn perform(
        &mut self,
        coordinator: &Coordinator,
        work: &[Work<'_>],
        members: &[usize],
    ) -> Option<(Arc<[TensorId]>, Order)> {
        let head = members.first().map(|&m| work[m].response)?;
        // A repeated group: one fused allreduce over one whole submission
        // of lent tensors, without reading the other responses.
        let fused_allreduce = head.kind == ResponseKind::Op(RequestKind::Allreduce);
        if fused_allreduce && !self.timeline.is_enabled() && self.whole_served(head) {
            if let Some(whole) = self.whole_submission(work, members) {
                let ids = self.batches.ids(whole.key()).map(Arc::clone);
                let order = whole.order().clone();
                self.record_operation(members.len());
                self.perform_whole(head, whole);
                return ids.map(|ids| (ids, order));
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
            self.record_operation(slots.len());
        }
        tracing::trace!(rank = self.rank, %kind, tensors = slots.len(), "performing");
        let params = ParamsOf(coordinator);
        if crate::engine::placement::on_device(head) {
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
                // A join's result is the last rank to join (the response's
                // root), the same on every rank.
                let result = match kind {
                    RequestKind::Barrier => self.backend.barrier().map_err(Error::from_transport),
                    _ => Ok(()),
                };
                let last = parts
                    .first()
                    .map_or(0, |r| to_usize(u64::from(r.root_rank)));
                let names = parts.iter().flat_map(|r| r.tensor_names.iter());
                let mut done = Vec::with_capacity(slots.len());
                for (name, slot) in names.zip(slots) {
                    self.timeline.op_end(name, "", &[]);
                    if let Some(entry) = slot {
                        let payload = result.clone().map(|()| match kind {
                            RequestKind::Join => Box::new(last) as Payload,
                            _ => Box::new(()) as Payload,
                        });
                        done.push((entry.part, payload));
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
                    Err(Error::from_response(name, &response.error_message)
                        .stall_as_timeout(self.shared.stall_timeout)),
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
mod device_tests;
