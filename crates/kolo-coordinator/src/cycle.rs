//! The thin shell: one negotiation cycle over a [`Controller`].
//!
//! 1. The rank sorts its new requests (by [`TensorId`]) into cache hits
//!    (bit path) and requests for rank 0, and builds its [`LocalBits`].
//! 2. One `bitwise_allreduce(And)` (see [`crate::bit_vector`]) tells every
//!    rank who wants shutdown, who joined, which slots are invalid, which hits
//!    every rank has, and whether anybody has work for rank 0.
//! 3. Nobody has: the agreed hits, in slot order, are the responses; no
//!    request list travels.
//! 4. Otherwise every rank's list is gathered to rank 0, which decides with
//!    [`Negotiator::negotiate`] and broadcasts the [`ResponseList`]; the
//!    agreed hits follow its responses.
//! 5. Every rank applies the agreed sequence to its cache identically.

use crate::bit_vector::{BitLayout, CycleBits, LocalBits};
use crate::config::CoordinatorConfig;
use crate::error::CoordinatorError;
use crate::names::{NameError, Names, TensorId};
use crate::negotiate::{Decision, Negotiator, Round};
use crate::output::{Agreed, CycleOutput, CycleStats, Hit, NegotiationEvent};
use crate::pending::{Intake, PendingRequests, Submission};
use crate::response_cache::ResponseCache;
use crate::stall::{stalled, CachePathStall, CachePathStalls, StallInspector};
use kolo_protocol::{
    decode_request_list, decode_response_list, encode_request_list, encode_response_list, Params,
    Request, RequestKind, RequestList, Response, ResponseKind, ResponseList,
};
use kolo_transport::{BitOp, Controller, TransportError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Rank 0's extra state.
#[derive(Debug)]
struct Rank0 {
    negotiator: Negotiator,
    inspector: StallInspector,
    cache_stalls: CachePathStalls,
    /// Cache-path stalls found last cycle, invalidated this cycle.
    invalidate_next: Vec<CachePathStall>,
    /// Since when those tensors waited, for their table entries.
    first_seen: HashMap<String, Instant>,
    /// Joined ranks as of the last cycle.
    joined: Vec<u32>,
}

/// One rank's negotiation state.
#[derive(Debug)]
pub struct Coordinator {
    rank: usize,
    size: usize,
    config: CoordinatorConfig,
    names: Names,
    cache: ResponseCache,
    pending: PendingRequests,
    rank0: Option<Box<Rank0>>,
}

impl Coordinator {
    /// The state of `rank` in a world of `size` ranks. Every rank must pass
    /// the same `config`.
    pub fn new(rank: usize, size: usize, config: CoordinatorConfig) -> Self {
        let rank0 = (rank == 0).then(|| {
            Box::new(Rank0 {
                negotiator: Negotiator::new(size),
                inspector: StallInspector::new(),
                cache_stalls: CachePathStalls::new(),
                invalidate_next: Vec::new(),
                first_seen: HashMap::new(),
                joined: Vec::new(),
            })
        });
        Coordinator {
            rank,
            size,
            names: Names::new(),
            cache: ResponseCache::new(config.cache_capacity),
            pending: PendingRequests::new(rank as u32),
            config,
            rank0,
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The response cache (identical slot assignment on every rank).
    pub fn cache(&self) -> &ResponseCache {
        &self.cache
    }

    /// Number of this rank's requests still waiting for a response.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// This rank's tensor names by id.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Names this rank's tensor `id` (before the first cycle that submits
    /// it). The caller chooses the ids: small integers, unique per name
    /// while registered.
    pub fn register(&mut self, id: TensorId, name: &str) -> Result<(), NameError> {
        self.names.register(id, name)
    }

    /// Drops `id` if nothing refers to it any more (no request of it is
    /// pending and no cache slot holds it) and returns whether it did; the
    /// id may then name another tensor.
    pub fn forget(&mut self, id: TensorId) -> bool {
        if self.pending.is_pending(id) || self.cache.slot_of_id(id).is_some() {
            return false;
        }
        self.names.forget(id);
        self.pending.forget(id);
        true
    }

    /// The parameters of this rank's last request for `id`.
    pub fn params(&self, id: TensorId) -> Option<&Params> {
        self.pending.params(id)
    }

    /// [`Coordinator::cycle`] for callers that hold [`Request`]s: names
    /// not registered yet get ids after the highest registered one. (A
    /// caller that registers its own ids should submit by id.)
    pub fn cycle_requests<C: Controller + ?Sized>(
        &mut self,
        ctrl: &mut C,
        requests: Vec<Request>,
        shutdown: bool,
        now: Instant,
    ) -> Result<CycleOutput, CoordinatorError> {
        let mut submissions = Vec::with_capacity(requests.len());
        for request in requests {
            let id = match self.names.id(&request.tensor_name) {
                Some(id) => id,
                None => {
                    let id = TensorId(self.names.end());
                    self.names
                        .register(id, &request.tensor_name)
                        .map_err(|e| TransportError::InvalidArgument(e.to_string()))?;
                    id
                }
            };
            submissions.push(Submission::new(id, Params::of(&request)));
        }
        let mut output = self.cycle(ctrl, submissions, shutdown, now)?;
        for hit in std::mem::take(&mut output.hits) {
            if let Some(response) = self.cache.response(hit.slot) {
                output.responses.push(Agreed {
                    response: Arc::clone(response),
                    id: hit.id,
                });
            }
        }
        Ok(output)
    }

    /// This rank has joined and not every rank has yet.
    pub fn joined(&self) -> bool {
        self.pending.joined()
    }

    /// Runs one negotiation cycle over `ctrl` (a collective: every rank calls
    /// it). `submissions` are this rank's requests enqueued since the last
    /// cycle, by registered id; `shutdown` says this rank wants to stop;
    /// `now` drives the stall inspector.
    pub fn cycle<C: Controller + ?Sized>(
        &mut self,
        ctrl: &mut C,
        submissions: impl Into<Intake>,
        shutdown: bool,
        now: Instant,
    ) -> Result<CycleOutput, CoordinatorError> {
        Ok(
            match self.cycle_deferring(ctrl, submissions, shutdown, now)? {
                Cycle::Done(output) => output,
                Cycle::Hits(agreement) => self.finish_cycle(agreement),
            },
        )
    }

    /// [`Coordinator::cycle`], except that a cycle whose outcome is only
    /// cache hits (nothing gathered, invalidated, joined or shut down) ends
    /// at the agreement: [`Cycle::Hits`] says which slots every rank
    /// performs, and the rank's books (its pending requests settled, the
    /// cache's order and pins, rank 0's stall watch) wait for
    /// [`Coordinator::finish_cycle`], which must come before the next
    /// cycle. An engine can so perform a repeated step first and keep the
    /// books while its caller works. The slots' cached responses
    /// ([`Coordinator::cache`]) stay valid until then: nothing changes the
    /// cache in between.
    pub fn cycle_deferring<C: Controller + ?Sized>(
        &mut self,
        ctrl: &mut C,
        submissions: impl Into<Intake>,
        shutdown: bool,
        now: Instant,
    ) -> Result<Cycle, CoordinatorError> {
        if ctrl.rank() != self.rank || ctrl.size() != self.size {
            return Err(TransportError::InvalidArgument(format!(
                "coordinator of rank {} of {} run over a controller of rank {} of {}",
                self.rank,
                self.size,
                ctrl.rank(),
                ctrl.size()
            ))
            .into());
        }
        // The last cycle's hits have been performed.
        self.cache.unpin_all();
        self.pending.revalidate(&self.cache);
        let mut invalid = match submissions.into() {
            Intake::Each(each) => self.pending.intake(each, &self.cache),
            Intake::Group(ids) => self.pending.intake_group(&ids, &self.cache),
        };
        let mut gather_wanted = false;
        if let Some(r0) = self.rank0.as_deref_mut() {
            for stall in std::mem::take(&mut r0.invalidate_next) {
                if self.cache.name(stall.slot) == Some(stall.tensor.as_str()) {
                    invalid.push(stall.slot);
                }
            }
            gather_wanted = self.config.stall_shutdown.is_some_and(|limit| {
                !stalled(r0.negotiator.table(), now, limit, &r0.joined).is_empty()
            });
        }
        let local = LocalBits {
            shutdown,
            joined: self.pending.joined(),
            uncached: self.pending.has_uncached(),
            gather: gather_wanted,
            cache_capacity: self.cache.capacity(),
            invalid,
            hits: Vec::new(),
        };
        // The slots in use are the same on every rank (the cache changes
        // only with the agreed sequence): so is the vector's length.
        let layout = BitLayout::new(self.size, self.cache.extent());
        let mut words = layout.encode_with_hits(self.rank, &local, self.pending.hit_words());
        ctrl.bitwise_allreduce(&mut words, BitOp::And)?;
        let bits = layout.decode(&words);
        if bits.cache_capacities_differ {
            return Err(CoordinatorError::CacheCapacityMismatch {
                rank: self.rank,
                capacity: self.cache.capacity(),
            });
        }

        let joined_any = bits.any_joined();
        let everyone_joined = bits.everyone_joined(self.size);
        let agreed = bits.agreed_hits();
        self.pending.route(&bits);
        for &slot in &bits.invalid {
            self.cache.erase(slot);
        }
        let gather = bits.needs_gather(self.size);
        if !gather && !joined_any && bits.invalid.is_empty() && bits.shutdown_ranks.is_empty() {
            return Ok(Cycle::Hits(Agreement { bits, agreed, now }));
        }
        let cached = self.settle(&agreed);
        let mut output = CycleOutput {
            shutdown_ranks: bits.shutdown_ranks.clone(),
            stats: CycleStats {
                gathered: gather,
                cache_hits: cached.len(),
            },
            ..CycleOutput::default()
        };
        let mut from_rank0 = Vec::new();
        if gather {
            let (list, events) = self.exchange(ctrl, shutdown, &bits, now)?;
            output.stall_shutdown = list.shutdown;
            from_rank0 = list.responses;
            output.events = events;
        }
        self.conclude(&mut output, &bits, &agreed, cached, from_rank0, now);
        if everyone_joined {
            self.pending.end_join_round();
        }
        self.warn_stalls(&bits, everyone_joined, now);
        Ok(Cycle::Done(output))
    }

    /// Ends a cycle that [`Coordinator::cycle_deferring`] left at its
    /// agreement: what [`Coordinator::cycle`] would have returned.
    pub fn finish_cycle(&mut self, agreement: Agreement) -> CycleOutput {
        let Agreement { bits, agreed, now } = agreement;
        let cached = self.settle(&agreed);
        let mut output = CycleOutput {
            stats: CycleStats {
                gathered: false,
                cache_hits: cached.len(),
            },
            ..CycleOutput::default()
        };
        self.conclude(&mut output, &bits, &agreed, cached, Vec::new(), now);
        self.warn_stalls(&bits, false, now);
        output
    }

    /// Settles this rank's requests on the agreed slots and pins the slots
    /// until they are performed (after this cycle).
    fn settle(&mut self, agreed: &[usize]) -> Vec<Hit> {
        let mut cached = Vec::new();
        self.pending.settle_hits(agreed, &mut cached);
        self.cache.pin(agreed);
        cached
    }

    /// The rest of a cycle after the agreement (and rank 0's decision):
    /// rank 0's cache-path watch and events, the agreed sequence applied.
    fn conclude(
        &mut self,
        output: &mut CycleOutput,
        bits: &CycleBits,
        agreed: &[usize],
        cached: Vec<Hit>,
        from_rank0: Vec<Response>,
        now: Instant,
    ) {
        self.watch_cache_path(bits, agreed, now);
        if self.rank0.is_some() && self.config.events {
            output.events.extend(cached_events(&self.cache, &cached));
        }
        output.responses = self.apply(from_rank0, agreed, bits.any_joined());
        output.hits = cached;
        output.shutdown = output.stall_shutdown || !output.shutdown_ranks.is_empty();
    }

    /// Gathers the request lists to rank 0, which negotiates and broadcasts
    /// the response list. Returns the list and (rank 0) the events.
    fn exchange<C: Controller + ?Sized>(
        &mut self,
        ctrl: &mut C,
        shutdown: bool,
        bits: &CycleBits,
        now: Instant,
    ) -> Result<(ResponseList, Vec<NegotiationEvent>), CoordinatorError> {
        let list = RequestList {
            requests: self.pending.take_outbox(&self.names),
            shutdown,
        };
        let gathered = ctrl.gather_bytes(&encode_request_list(&list), 0)?;
        let Some(r0) = self.rank0.as_deref_mut() else {
            let bytes = ctrl.broadcast_bytes(&[], 0)?;
            let reply = decode_response_list(&bytes).map_err(|e| CoordinatorError::Decode {
                rank: 0,
                message: e.to_string(),
            })?;
            if let Some(message) = abort_message(&reply) {
                return Err(CoordinatorError::Aborted { message });
            }
            return Ok((reply, Vec::new()));
        };
        let lists = match decode_lists(gathered, self.size) {
            Ok(lists) => lists,
            Err(error) => {
                // Tell the other ranks instead of leaving them waiting.
                let abort = ResponseList {
                    responses: vec![abort_response(error.to_string())],
                    shutdown: true,
                };
                ctrl.broadcast_bytes(&encode_response_list(&abort), 0)?;
                return Err(error);
            }
        };
        let decision: Decision = r0.negotiator.negotiate(Round {
            lists: &lists,
            joined: &bits.joined_ranks,
            now,
            stall_shutdown: self.config.stall_shutdown,
            first_seen: &r0.first_seen,
        });
        r0.first_seen.clear();
        let reply = ResponseList {
            responses: decision.responses,
            shutdown: decision.shutdown,
        };
        ctrl.broadcast_bytes(&encode_response_list(&reply), 0)?;
        Ok((reply, decision.events))
    }

    /// Applies the agreed sequence to the cache and the pending requests,
    /// identically on every rank: hits are touched (slot order; their
    /// requests were settled already), then the successful responses from
    /// rank 0 are settled and inserted (response order), unless a rank is
    /// joined (such responses lack the joined ranks and may be adjusted
    /// for the join). Returns rank 0's responses with this rank's ids.
    fn apply(
        &mut self,
        from_rank0: Vec<Response>,
        agreed: &[usize],
        joined_any: bool,
    ) -> Vec<Agreed> {
        self.cache.touch_all(agreed);
        let mut out = Vec::with_capacity(from_rank0.len());
        for response in from_rank0 {
            let mine = self.pending.answer(&response, &self.names);
            let response = Arc::new(response);
            let cacheable = !joined_any
                && matches!(response.kind, ResponseKind::Op(kind) if kind != RequestKind::Join);
            if let (true, [name]) = (cacheable, response.tensor_names.as_slice()) {
                let (id, params) = match &mine {
                    Some((id, params)) => (Some(*id), params.clone()),
                    None => (None, None),
                };
                let shared = match id.and_then(|id| self.names.shared(id)) {
                    Some(shared) => Arc::clone(shared),
                    None => Arc::from(name.as_str()),
                };
                self.cache
                    .insert(&shared, id, Arc::clone(&response), params);
            }
            let id = match response.tensor_names.len() {
                1 => mine.map(|(id, _)| id),
                _ => None,
            };
            out.push(Agreed { response, id });
        }
        out
    }

    /// Rank 0: times the slots that wait on the bit path and schedules those
    /// waiting past the threshold for invalidation next cycle.
    fn watch_cache_path(&mut self, bits: &CycleBits, agreed: &[usize], now: Instant) {
        let (Some(r0), Some(threshold)) = (
            self.rank0.as_deref_mut(),
            self.config.cache_stall_threshold(),
        ) else {
            return;
        };
        if !bits.joined_ranks.is_empty() {
            r0.cache_stalls.clear();
            return;
        }
        // Every agreed slot is a hit of some rank: with as many hits as
        // agreed slots, nothing waits (the common case, checked without a
        // pass over the slots).
        let waiting: Vec<(usize, Arc<str>)> = if bits.hits_any.len() == agreed.len() {
            Vec::new()
        } else {
            sorted_difference(&bits.hits_any, agreed)
                .filter(|s| bits.invalid.binary_search(s).is_err())
                .filter_map(|slot| {
                    self.cache
                        .shared_name(slot)
                        .map(|name| (slot, Arc::clone(name)))
                })
                .collect()
        };
        for stall in r0.cache_stalls.observe(&waiting, now, threshold) {
            tracing::debug!(
                tensor = %stall.tensor,
                slot = stall.slot,
                "tensor waited on the response cache path too long; sending it through rank 0"
            );
            r0.first_seen.insert(stall.tensor.clone(), stall.since);
            r0.invalidate_next.push(stall);
        }
    }

    /// Rank 0: warns about stalled tensors once per warning period.
    fn warn_stalls(&mut self, bits: &CycleBits, everyone_joined: bool, now: Instant) {
        let Some(r0) = self.rank0.as_deref_mut() else {
            return;
        };
        r0.joined = if everyone_joined {
            Vec::new()
        } else {
            bits.joined_ranks.clone()
        };
        let Some(period) = self.config.stall_warning else {
            return;
        };
        let reports = stalled(r0.negotiator.table(), now, period, &r0.joined);
        for report in r0.inspector.due(reports, now, period) {
            tracing::warn!(
                tensor = %report.tensor,
                submitted = ?report.submitted,
                missing = ?report.missing,
                "{}",
                report.message()
            );
        }
    }
}

/// What [`Coordinator::cycle_deferring`] returns.
#[derive(Debug)]
pub enum Cycle {
    /// The whole cycle, as [`Coordinator::cycle`] returns it.
    Done(CycleOutput),
    /// Only cache hits were agreed; the cycle ends with
    /// [`Coordinator::finish_cycle`].
    Hits(Agreement),
}

/// A cycle of cache hits only, agreed by every rank and not yet settled
/// (see [`Coordinator::cycle_deferring`]).
#[derive(Debug)]
pub struct Agreement {
    bits: CycleBits,
    agreed: Vec<usize>,
    now: Instant,
}

impl Agreement {
    /// The cache slots every rank performs now, ascending: the same list
    /// [`CycleOutput::hits`] will give, slot by slot.
    pub fn slots(&self) -> &[usize] {
        &self.agreed
    }
}

/// The elements of `all` not in `some`, both ascending (one merge pass).
fn sorted_difference<'a>(all: &'a [usize], some: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
    let mut rest = some.iter().peekable();
    all.iter().copied().filter(move |&x| {
        while rest.peek().is_some_and(|&&y| y < x) {
            rest.next();
        }
        rest.peek() != Some(&&x)
    })
}

/// Decodes the gathered request lists (one per rank).
fn decode_lists(
    gathered: Option<Vec<Vec<u8>>>,
    size: usize,
) -> Result<Vec<RequestList>, CoordinatorError> {
    let messages = gathered.unwrap_or_default();
    if messages.len() != size {
        return Err(TransportError::InvalidArgument(format!(
            "gather_bytes returned {} messages on the root of a world of {size} ranks",
            messages.len()
        ))
        .into());
    }
    messages
        .iter()
        .enumerate()
        .map(|(rank, bytes)| {
            decode_request_list(bytes).map_err(|e| CoordinatorError::Decode {
                rank,
                message: e.to_string(),
            })
        })
        .collect()
}

/// The list rank 0 broadcasts when it cannot negotiate: one error response
/// without tensor names (real responses always name a tensor) and shutdown.
fn abort_response(message: String) -> Response {
    let mut response = Response::error(String::new(), message);
    response.tensor_names.clear();
    response
}

/// The message of an abort list from rank 0.
fn abort_message(list: &ResponseList) -> Option<String> {
    match list.responses.as_slice() {
        [only] if list.shutdown && only.is_error() && only.tensor_names.is_empty() => {
            Some(only.error_message.clone())
        }
        _ => None,
    }
}

/// Start + End events of the cache hits (rank 0's timeline).
fn cached_events(cache: &ResponseCache, cached: &[Hit]) -> Vec<NegotiationEvent> {
    let mut events = Vec::new();
    for response in cached.iter().filter_map(|hit| cache.response(hit.slot)) {
        let ResponseKind::Op(kind) = response.kind else {
            continue;
        };
        for tensor in &response.tensor_names {
            events.push(NegotiationEvent::Start {
                tensor: tensor.clone(),
                kind,
            });
            events.push(NegotiationEvent::End {
                tensor: tensor.clone(),
            });
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::sorted_difference;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn sorted_difference_is_the_set_difference(
            all in prop::collection::btree_set(0usize..200, 0..60),
            some in prop::collection::btree_set(0usize..200, 0..60),
        ) {
            let a: Vec<usize> = all.iter().copied().collect();
            let b: Vec<usize> = some.iter().copied().collect();
            let expected: Vec<usize> = all.difference(&some).copied().collect::<BTreeSet<_>>().into_iter().collect();
            prop_assert_eq!(sorted_difference(&a, &b).collect::<Vec<_>>(), expected);
        }
    }
}
