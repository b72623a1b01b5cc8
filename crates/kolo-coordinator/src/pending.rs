//! One rank's requests in flight: which wait on the response cache's bit
//! path (by slot), which go to rank 0 with the next gather, and this rank's
//! own parameters for every tensor (what it stores with a cache entry).
//!
//! Everything is indexed by [`TensorId`] and by cache slot: taking in a
//! request that hits the cache, settling it once every rank agreed, and
//! revalidating it are array accesses, with no name touched. A request that
//! repeats its tensor's last parameters comes without them
//! ([`Submission::params`] `None`): a training step that repeats the last
//! one hands over only ids, and its cache hits are known without comparing
//! anything while the cache is unchanged.
//!
//! A whole group of such repeats ([`Intake::Group`]) that repeats the last
//! group taken in, while nothing else is pending, goes further: it is
//! taken in and settled as one unit (its bits copied in, its hits copied
//! out), without a pass over its ids. Anything that needs the ids one by
//! one first writes their states as the one-by-one path would have
//! ([`PendingRequests::materialize`]), so the group is never seen half
//! taken in.

use crate::bit_vector::CycleBits;
use crate::names::{Names, TensorId};
use crate::output::Hit;
use crate::response_cache::{Lookup, ResponseCache};
use kolo_protocol::{Params, Request, RequestKind, Response};
use std::sync::Arc;

/// One request of this rank for a cycle: the tensor's id (see
/// [`crate::Coordinator::register`]) and what is asked of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Submission {
    /// The tensor.
    pub id: TensorId,
    /// The collective and its parameters; `None` repeats those of the id's
    /// last submission (an id's first submission must carry them).
    pub params: Option<Box<Params>>,
}

impl Submission {
    /// A request for `id` with `params`.
    pub fn new(id: TensorId, params: Params) -> Self {
        Submission {
            id,
            params: Some(Box::new(params)),
        }
    }

    /// A request for `id` that repeats its last parameters.
    pub fn repeat(id: TensorId) -> Self {
        Submission { id, params: None }
    }
}

/// One cycle's new requests.
#[derive(Clone, Debug, PartialEq)]
pub enum Intake {
    /// Request by request, in order.
    Each(Vec<Submission>),
    /// A group of tensors that all repeat their last parameters: the same
    /// as [`Submission::repeat`] of each id, in order. Repeating the last
    /// group taken in (the same `Arc`), it is taken in as one unit.
    Group(Arc<[TensorId]>),
}

impl Intake {
    /// True when there is no request.
    pub fn is_empty(&self) -> bool {
        match self {
            Intake::Each(each) => each.is_empty(),
            Intake::Group(ids) => ids.is_empty(),
        }
    }
}

impl From<Vec<Submission>> for Intake {
    fn from(each: Vec<Submission>) -> Self {
        Intake::Each(each)
    }
}

/// A request for rank 0: the tensor and the parameters it is sent with.
#[derive(Clone, Debug, PartialEq)]
struct Outgoing {
    id: TensorId,
    params: Params,
}

/// "No slot" in the per-id state.
const NO_SLOT: u32 = u32::MAX;

/// What one rank knows of one of its ids on the fast path, in one place.
#[derive(Clone, Copy, Debug)]
struct IdState {
    /// The cache slot the id's last parameters hit, and the cache
    /// generation then (a repeat hits again while the cache is unchanged).
    memo_slot: u32,
    memo_generation: u64,
    /// The slot the id's request waits on, on the bit path.
    waiting: u32,
    /// The id has a request in flight (join requests excluded).
    in_flight: bool,
}

impl Default for IdState {
    fn default() -> Self {
        IdState {
            memo_slot: NO_SLOT,
            memo_generation: 0,
            waiting: NO_SLOT,
            in_flight: false,
        }
    }
}

/// One rank's requests that have no response yet.
#[derive(Clone, Debug, Default)]
pub struct PendingRequests {
    rank: u32,
    /// The parameters of each id's last submission.
    last: Vec<Option<Params>>,
    /// Each id's fast-path state.
    ids: Vec<IdState>,
    /// Number of ids in flight.
    in_flight_count: usize,
    /// The tensor waiting on each cache slot's bit, over the cache's
    /// slots in use (grown with its extent, never sized by its capacity).
    hits: Vec<Option<TensorId>>,
    /// The same as a bit set (the words this rank contributes).
    hit_words: Vec<u64>,
    /// Number of `Some` in `hits`.
    hit_count: usize,
    /// Requests for rank 0, sent with the next gather.
    outbox: Vec<Outgoing>,
    /// This rank has joined (until every rank has).
    joined: bool,
    /// The cache generation the bit-path requests were last checked
    /// against (every request entering the bit path is checked on the way
    /// in).
    validated: Option<u64>,
    /// The last group taken in whose every request hit the cache.
    group: Option<Arc<GroupMemo>>,
    /// `group` is in flight as one unit: the pending counts and bits
    /// include it, its ids' states and `hits` do not (yet).
    lane: bool,
    /// Bumped whenever something a [`GroupMemo`] relies on changes other
    /// than the cache (an id forgotten, new parameters).
    epoch: u64,
}

/// A group whose every request hit the cache, as taken in: valid while
/// the cache generation and the epoch are unchanged.
#[derive(Debug)]
struct GroupMemo {
    ids: Arc<[TensorId]>,
    /// The slot each id hit, in the group's order.
    slots: Vec<u32>,
    /// The slots ascending (what every rank agrees on when it repeats).
    sorted: Vec<usize>,
    /// The hits in slot order, as settling returns them.
    hits: Vec<Hit>,
    /// The slots as a bit set over the cache.
    words: Vec<u64>,
    generation: u64,
    epoch: u64,
}

/// `slots[index]`, grown with `None` as needed.
fn at<T: Clone>(slots: &mut Vec<Option<T>>, index: usize) -> &mut Option<T> {
    if slots.len() <= index {
        slots.resize(index + 1, None);
    }
    &mut slots[index]
}

/// Bits being set in (or cleared from) one word of a bit set, kept in a
/// register until a slot of another word comes, then applied to the set:
/// a run of consecutive slots costs one read-modify-write per word instead
/// of one per slot.
struct WordFill {
    /// Word index + 1 (0: none yet).
    at: usize,
    bits: u64,
    clear: bool,
}

impl WordFill {
    /// A fill that sets bits.
    fn setting() -> Self {
        WordFill {
            at: 0,
            bits: 0,
            clear: false,
        }
    }

    /// A fill that clears bits.
    fn clearing() -> Self {
        WordFill {
            clear: true,
            ..WordFill::setting()
        }
    }

    /// Sets (or clears) `slot`'s bit, applying the pending word first if
    /// `slot` lies in another.
    #[inline]
    fn mark(&mut self, words: &mut [u64], slot: usize) {
        let at = slot / 64 + 1;
        if at != self.at {
            self.finish(words);
            self.at = at;
        }
        self.bits |= 1 << (slot % 64);
    }

    /// Applies the pending bits to `words`.
    #[inline]
    fn finish(&mut self, words: &mut [u64]) {
        if let Some(word) = self.at.checked_sub(1).and_then(|w| words.get_mut(w)) {
            if self.clear {
                *word &= !self.bits;
            } else {
                *word |= self.bits;
            }
        }
        self.at = 0;
        self.bits = 0;
    }
}

impl PendingRequests {
    /// Nothing pending for `rank`. The tables of cache slots grow with the
    /// cache's slots in use as requests are taken in.
    pub fn new(rank: u32) -> Self {
        PendingRequests {
            rank,
            ..Self::default()
        }
    }

    /// Grows the tables of cache slots to `cache`'s slots in use (which
    /// never shrink), so that every slot a lookup returns has its entry.
    fn fit(&mut self, cache: &ResponseCache) {
        let slots = cache.extent();
        if self.hits.len() < slots {
            self.hits.resize(slots, None);
            self.hit_words.resize(slots.div_ceil(64), 0);
        }
    }

    /// This rank has joined and the round has not ended.
    pub fn joined(&self) -> bool {
        self.joined
    }

    /// Number of requests without a response (join requests excluded).
    pub fn len(&self) -> usize {
        self.in_flight_count
    }

    /// True when no request waits for a response.
    pub fn is_empty(&self) -> bool {
        self.in_flight_count == 0
    }

    /// True while `id` has a request without a response.
    pub fn is_pending(&self, id: TensorId) -> bool {
        self.flying(id)
            || self.outbox.iter().any(|o| o.id == id)
            || (self.lane && self.group.as_ref().is_some_and(|g| g.ids.contains(&id)))
    }

    /// The parameters of `id`'s last submission.
    pub fn params(&self, id: TensorId) -> Option<&Params> {
        self.last.get(id.index())?.as_ref()
    }

    /// Forgets everything about `id` (it is not pending).
    pub fn forget(&mut self, id: TensorId) {
        self.materialize();
        self.epoch += 1;
        if let Some(last) = self.last.get_mut(id.index()) {
            *last = None;
        }
        if let Some(state) = self.ids.get_mut(id.index()) {
            *state = IdState::default();
        }
    }

    /// `id`'s state, grown as needed.
    fn state(&mut self, id: TensorId) -> &mut IdState {
        if self.ids.len() <= id.index() {
            self.ids.resize(id.index() + 1, IdState::default());
        }
        &mut self.ids[id.index()]
    }

    /// True when `id` is in flight.
    fn flying(&self, id: TensorId) -> bool {
        self.ids.get(id.index()).is_some_and(|s| s.in_flight)
    }

    /// Marks `id` in flight or not.
    fn fly(&mut self, id: TensorId, flying: bool) {
        let state = self.state(id);
        let was = std::mem::replace(&mut state.in_flight, flying);
        match (was, flying) {
            (false, true) => self.in_flight_count += 1,
            (true, false) => self.in_flight_count -= 1,
            _ => {}
        }
    }

    /// `id` waits on `slot`'s bit.
    fn wait_on(&mut self, slot: usize, id: TensorId) {
        self.hits[slot] = Some(id);
        self.hit_words[slot / 64] |= 1 << (slot % 64);
        self.hit_count += 1;
        self.state(id).waiting = slot as u32;
    }

    /// Clears the bit-path wait on `slot`; returns who waited.
    fn unwait(&mut self, slot: usize) -> Option<TensorId> {
        let id = self.hits.get_mut(slot)?.take()?;
        self.hit_words[slot / 64] &= !(1 << (slot % 64));
        self.hit_count -= 1;
        if let Some(state) = self.ids.get_mut(id.index()) {
            state.waiting = NO_SLOT;
        }
        Some(id)
    }

    /// Requests for rank 0 are waiting.
    pub fn has_uncached(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// The cache slots this rank has a pending hit for, ascending.
    pub fn hit_slots(&self) -> Vec<usize> {
        let mut slots = Vec::with_capacity(self.hit_count);
        for (w, &word) in self.hit_words.iter().enumerate() {
            let mut rest = word;
            while rest != 0 {
                slots.push(w * 64 + rest.trailing_zeros() as usize);
                rest &= rest - 1;
            }
        }
        slots
    }

    /// The pending hits as a bit set over the cache slots (bit `s % 64` of
    /// word `s / 64`), what this rank contributes to the cycle.
    pub fn hit_words(&self) -> &[u64] {
        &self.hit_words
    }

    /// Sends to rank 0 every bit-path request whose slot no longer holds its
    /// tensor with its parameters (evicted or replaced since it was queued).
    pub fn revalidate(&mut self, cache: &ResponseCache) {
        if self.validated == Some(cache.generation()) {
            return;
        }
        self.materialize();
        self.validated = Some(cache.generation());
        if self.hit_count == 0 {
            return;
        }
        for slot in self.hit_slots() {
            let Some(id) = self.hits[slot] else { continue };
            let valid = self
                .params(id)
                .is_some_and(|params| cache.matches(slot, id, params));
            if !valid {
                self.send_to_rank0(id);
            }
        }
    }

    /// Takes this cycle's new requests and returns the slots they
    /// invalidate (cached tensors requested with other parameters). A join
    /// request marks the rank joined and goes to rank 0. A repeat of an id
    /// that has no parameters yet (a caller's bug) goes to rank 0 unnamed
    /// and empty, which fails it.
    pub fn intake(
        &mut self,
        submissions: impl IntoIterator<Item = Submission>,
        cache: &ResponseCache,
    ) -> Vec<usize> {
        self.materialize();
        self.fit(cache);
        let mut invalid = Vec::new();
        let generation = cache.generation();
        // The fast path keeps its counts and the bit word it is filling in
        // registers (a repeated group's slots are mostly consecutive): no
        // chain of loads and stores through `self` per request.
        let mut settled = 0usize;
        let mut word = WordFill::setting();
        for Submission { id, params } in submissions {
            match params {
                Some(params) => {
                    *at(&mut self.last, id.index()) = Some(*params);
                    self.epoch += 1;
                }
                None => {
                    // The fast path: a repeat of a request that hit this
                    // slot, the cache unchanged since (a join never hits:
                    // not a join), the slot's bit free.
                    if let Some(state) = self.ids.get_mut(id.index()) {
                        let slot = state.memo_slot as usize;
                        let fresh = !state.in_flight
                            && state.memo_slot != NO_SLOT
                            && state.memo_generation == generation;
                        if let (true, Some(hit @ None)) = (fresh, self.hits.get_mut(slot)) {
                            *hit = Some(id);
                            word.mark(&mut self.hit_words, slot);
                            state.waiting = slot as u32;
                            state.in_flight = true;
                            settled += 1;
                            continue;
                        }
                    }
                }
            }
            // The slow path reads and writes the counts and bits itself.
            word.finish(&mut self.hit_words);
            self.hit_count += settled;
            self.in_flight_count += settled;
            settled = 0;
            self.intake_slow(id, cache, &mut invalid);
        }
        word.finish(&mut self.hit_words);
        self.hit_count += settled;
        self.in_flight_count += settled;
        invalid
    }

    /// Takes in a group of repeats ([`Intake::Group`]) and returns the
    /// slots they invalidate. When it is the last group taken in whose
    /// every request hit, the cache and the epoch are unchanged since, and
    /// nothing else is pending, the group goes in as one: its bits and
    /// counts are added, its ids' states are left for
    /// [`PendingRequests::materialize`] (or settled as they are, see
    /// [`PendingRequests::settle_hits`]). Otherwise it is taken in request
    /// by request, and remembered if every request hit.
    pub fn intake_group(&mut self, ids: &Arc<[TensorId]>, cache: &ResponseCache) -> Vec<usize> {
        self.materialize();
        self.fit(cache);
        let idle = self.in_flight_count == 0
            && self.hit_count == 0
            && self.outbox.is_empty()
            && !self.joined;
        if let Some(group) = self.group.as_ref().filter(|g| {
            idle && Arc::ptr_eq(&g.ids, ids)
                && g.generation == cache.generation()
                && g.epoch == self.epoch
                && g.words.len() == self.hit_words.len()
        }) {
            self.hit_words.copy_from_slice(&group.words);
            self.hit_count = group.ids.len();
            self.in_flight_count = group.ids.len();
            self.lane = true;
            return Vec::new();
        }
        let invalid = self.intake(ids.iter().map(|&id| Submission::repeat(id)), cache);
        self.group = None;
        if idle && invalid.is_empty() {
            self.remember_group(ids, cache);
        }
        invalid
    }

    /// Remembers `ids`, just taken in while nothing else was pending, if
    /// every one of its requests waits on a slot of its own.
    fn remember_group(&mut self, ids: &Arc<[TensorId]>, cache: &ResponseCache) {
        if !self.outbox.is_empty()
            || self.hit_count != ids.len()
            || self.in_flight_count != ids.len()
        {
            return;
        }
        let mut slots = Vec::with_capacity(ids.len());
        for id in ids.iter() {
            match self.ids.get(id.index()) {
                Some(state) if state.waiting != NO_SLOT => slots.push(state.waiting),
                _ => return,
            }
        }
        let mut sorted: Vec<usize> = slots.iter().map(|&slot| slot as usize).collect();
        sorted.sort_unstable();
        let hits = sorted
            .iter()
            .map(|&slot| Hit {
                slot,
                id: self.hits[slot],
            })
            .collect();
        self.group = Some(Arc::new(GroupMemo {
            ids: Arc::clone(ids),
            slots,
            sorted,
            hits,
            words: self.hit_words.clone(),
            generation: cache.generation(),
            epoch: self.epoch,
        }));
    }

    /// Writes the states of a group taken in as one, as
    /// [`PendingRequests::intake`] would have left them (its counts and
    /// bits are in already); nothing when there is none.
    pub fn materialize(&mut self) {
        if !std::mem::replace(&mut self.lane, false) {
            return;
        }
        let Some(group) = self.group.clone() else {
            return;
        };
        for (&id, &slot) in group.ids.iter().zip(&group.slots) {
            self.hits[slot as usize] = Some(id);
            let state = self.state(id);
            state.waiting = slot;
            state.in_flight = true;
        }
    }

    /// [`PendingRequests::intake`] of one request that the fast path did
    /// not settle.
    fn intake_slow(&mut self, id: TensorId, cache: &ResponseCache, invalid: &mut Vec<usize>) {
        let Some(kind) = self.params(id).map(|p| p.kind) else {
            self.outbox.push(Outgoing {
                id,
                params: Params::new(RequestKind::Barrier, kolo_protocol::DataType::U8, []),
            });
            return;
        };
        if kind == RequestKind::Join || self.flying(id) {
            if kind == RequestKind::Join {
                self.joined = true;
            } else {
                // A tensor twice in flight: both go to rank 0, which fails
                // it.
                self.send_to_rank0(id);
            }
            if let Some(params) = self.params(id).cloned() {
                self.outbox.push(Outgoing { id, params });
            }
            return;
        }
        let Some(params) = self.last.get(id.index()).and_then(Option::as_ref) else {
            return;
        };
        let lookup = cache.lookup(id, params);
        let generation = cache.generation();
        let params = params.clone();
        let state = self.state(id);
        match lookup {
            Lookup::Hit(slot) => {
                state.memo_slot = slot as u32;
                state.memo_generation = generation;
            }
            _ => state.memo_slot = NO_SLOT,
        }
        match lookup {
            Lookup::Hit(slot) if slot < self.hits.len() && self.hits[slot].is_none() => {
                self.wait_on(slot, id);
            }
            Lookup::Mismatch(slot) => {
                invalid.push(slot);
                self.outbox.push(Outgoing { id, params });
            }
            _ => self.outbox.push(Outgoing { id, params }),
        }
        self.fly(id, true);
    }

    /// After the bit allreduce: bit-path requests on invalidated slots, and
    /// all of them while any rank has joined (rank 0 must see who
    /// contributes), go to rank 0.
    pub fn route(&mut self, bits: &CycleBits) {
        if self.hit_count == 0 {
            return;
        }
        if bits.any_joined() || !bits.invalid.is_empty() {
            self.materialize();
        }
        if bits.any_joined() {
            for slot in self.hit_slots() {
                if let Some(id) = self.hits[slot] {
                    self.send_to_rank0(id);
                }
            }
            return;
        }
        for &slot in &bits.invalid {
            if let Some(id) = self.hits.get(slot).copied().flatten() {
                self.send_to_rank0(id);
            }
        }
    }

    /// Settles the bit-path request on `slot` (every rank agreed on it) and
    /// returns its tensor.
    pub fn settle_hit(&mut self, slot: usize) -> Option<TensorId> {
        self.materialize();
        let id = self.hits.get_mut(slot)?.take()?;
        self.hit_words[slot / 64] &= !(1 << (slot % 64));
        self.hit_count -= 1;
        if let Some(state) = self.ids.get_mut(id.index()) {
            state.waiting = NO_SLOT;
            if std::mem::replace(&mut state.in_flight, false) {
                self.in_flight_count -= 1;
            }
        }
        Some(id)
    }

    /// [`PendingRequests::settle_hit`] of every slot of `slots` (ascending,
    /// every rank agreed on them), in order, appending its [`Hit`] to
    /// `out`: one tight pass (counts and the bit word being cleared kept in
    /// registers) for the many hits of a repeated step.
    pub fn settle_hits(&mut self, slots: &[usize], out: &mut Vec<Hit>) {
        if self.lane {
            if let Some(group) = self.group.as_ref().filter(|g| g.sorted == slots) {
                // The group taken in as one, agreed whole: nothing else is
                // pending (see `intake_group`), and its ids' states were
                // never written, so they are settled as they stand.
                out.extend_from_slice(&group.hits);
                self.hit_words.fill(0);
                self.hit_count = 0;
                self.in_flight_count -= group.ids.len();
                self.lane = false;
                return;
            }
            self.materialize();
        }
        out.reserve(slots.len());
        let mut settled = 0usize;
        let mut landed = 0usize;
        let mut word = WordFill::clearing();
        for &slot in slots {
            let id = self.hits.get_mut(slot).and_then(Option::take);
            if let Some(id) = id {
                word.mark(&mut self.hit_words, slot);
                settled += 1;
                if let Some(state) = self.ids.get_mut(id.index()) {
                    state.waiting = NO_SLOT;
                    landed += usize::from(std::mem::replace(&mut state.in_flight, false));
                }
            }
            out.push(Hit { slot, id });
        }
        word.finish(&mut self.hit_words);
        self.hit_count -= settled;
        self.in_flight_count -= landed;
    }

    /// The requests for rank 0, emptying the outbox: named through
    /// `names` (a request whose id has no name goes out unnamed, and rank
    /// 0 fails it).
    pub fn take_outbox(&mut self, names: &Names) -> Vec<Request> {
        std::mem::take(&mut self.outbox)
            .into_iter()
            .map(|o| {
                o.params
                    .to_request(self.rank, names.name(o.id).unwrap_or(""))
            })
            .collect()
    }

    /// Settles the tensor of a single-tensor `response` from rank 0 and
    /// returns its id and this rank's parameters for it (`None` for a name
    /// this rank does not have in flight). Every name of a response with
    /// several (a join) is settled; the first is returned.
    pub fn answer(
        &mut self,
        response: &Response,
        names: &Names,
    ) -> Option<(TensorId, Option<Params>)> {
        self.materialize();
        let mut first = None;
        for name in &response.tensor_names {
            let Some(id) = names.id(name) else { continue };
            let waiting = self.ids.get(id.index()).map_or(NO_SLOT, |s| s.waiting);
            if waiting != NO_SLOT {
                self.unwait(waiting as usize);
            }
            if !self.flying(id) {
                continue;
            }
            self.fly(id, false);
            if first.is_none() {
                first = Some((id, self.params(id).cloned()));
            }
        }
        first
    }

    /// Every rank has joined: the round ends.
    pub fn end_join_round(&mut self) {
        self.joined = false;
    }

    /// Moves a bit-path request to the outbox.
    fn send_to_rank0(&mut self, id: TensorId) {
        let waiting = self.ids.get(id.index()).map_or(NO_SLOT, |s| s.waiting);
        if waiting == NO_SLOT {
            return;
        }
        self.unwait(waiting as usize);
        if self.flying(id) {
            if let Some(params) = self.params(id).cloned() {
                self.outbox.push(Outgoing { id, params });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::DataType;
    use std::sync::Arc;

    fn params(len: u64) -> Params {
        Params::new(RequestKind::Allreduce, DataType::F32, [len])
    }

    fn sub(id: u32, len: u64) -> Submission {
        Submission::new(TensorId(id), params(len))
    }

    /// Names a, b, c, ... with ids 0, 1, 2, ...
    fn names() -> Names {
        let mut names = Names::new();
        for (i, n) in ["a", "b", "c", "j"].iter().enumerate() {
            names.register(TensorId(i as u32), n).unwrap();
        }
        names
    }

    /// A cache with `ids` cached (2 elements each) in slots 0, 1, ...
    fn cache_with(ids: &[u32]) -> ResponseCache {
        let names = names();
        let mut cache = ResponseCache::new(4);
        for &id in ids {
            let name = names.shared(TensorId(id)).unwrap();
            cache.insert(
                name,
                Some(TensorId(id)),
                Arc::new(Response::error(&**name, "")),
                Some(params(2)),
            );
        }
        cache
    }

    fn outbox_names(p: &mut PendingRequests) -> Vec<String> {
        p.take_outbox(&names())
            .into_iter()
            .map(|r| r.tensor_name)
            .collect()
    }

    #[test]
    fn hits_wait_misses_and_mismatches_go_to_rank_zero() {
        let cache = cache_with(&[0, 1]);
        let mut p = PendingRequests::new(1);
        let invalid = p.intake(vec![sub(0, 2), sub(1, 3), sub(2, 2)], &cache);
        assert_eq!(invalid, vec![1]);
        assert_eq!(p.hit_slots(), vec![0]);
        assert_eq!(outbox_names(&mut p), ["b", "c"]);
        assert_eq!(p.len(), 3);
        assert!(p.is_pending(TensorId(0)));
        assert_eq!(p.settle_hit(0), Some(TensorId(0)));
        assert_eq!(p.len(), 2);
        assert!(!p.is_pending(TensorId(0)));
    }

    #[test]
    fn eviction_and_invalidation_reroute() {
        let mut cache = cache_with(&[0, 1]);
        let mut p = PendingRequests::new(1);
        p.intake(vec![sub(0, 2), sub(1, 2)], &cache);
        cache.erase(0);
        p.revalidate(&cache);
        assert_eq!(p.hit_slots(), vec![1]);
        let bits = CycleBits {
            invalid: vec![1],
            ..CycleBits::default()
        };
        p.route(&bits);
        assert!(p.hit_slots().is_empty());
        assert_eq!(outbox_names(&mut p), ["a", "b"]);
    }

    #[test]
    fn joined_world_sends_everything_and_agreed_settles() {
        let cache = cache_with(&[0, 1]);
        let mut p = PendingRequests::new(1);
        p.intake(vec![sub(0, 2), sub(1, 2)], &cache);
        assert_eq!(p.settle_hit(0), Some(TensorId(0)));
        assert_eq!(p.hit_slots(), vec![1]);
        let joined = CycleBits {
            joined_ranks: vec![3],
            ..CycleBits::default()
        };
        p.route(&joined);
        assert_eq!(p.take_outbox(&names()).len(), 1);
        let answered = p.answer(&Response::error("b", ""), &names());
        assert_eq!(
            answered.map(|(id, p)| (id, p.is_some())),
            Some((TensorId(1), true))
        );
        assert!(p.is_empty());
    }

    #[test]
    fn repeats_hit_without_parameters_until_the_cache_changes() {
        let mut cache = cache_with(&[0, 1]);
        let mut p = PendingRequests::new(1);
        p.intake(vec![sub(0, 2), sub(1, 2)], &cache);
        assert_eq!(p.hit_slots(), vec![0, 1]);
        p.settle_hit(0);
        p.settle_hit(1);
        let repeat = |id| Submission::repeat(TensorId(id));
        p.intake(vec![repeat(0), repeat(1)], &cache);
        assert_eq!(p.hit_slots(), vec![0, 1], "repeats hit from the memo");
        p.settle_hit(0);
        p.settle_hit(1);
        assert_eq!(p.params(TensorId(1)), Some(&params(2)));
        // The cache changed: repeats are looked up again.
        cache.erase(1);
        p.intake(vec![repeat(0), repeat(1)], &cache);
        assert_eq!(p.hit_slots(), vec![0]);
        assert_eq!(outbox_names(&mut p), ["b"]);
        // New parameters replace the last ones.
        p.settle_hit(0);
        p.intake(vec![sub(0, 5)], &cache);
        assert_eq!(p.params(TensorId(0)), Some(&params(5)));
        assert!(p.hit_slots().is_empty());
        // A repeat of an id never submitted goes to rank 0, unnamed.
        let mut fresh = PendingRequests::new(1);
        fresh.intake(vec![repeat(3)], &cache);
        assert_eq!(fresh.take_outbox(&Names::new())[0].tensor_name, "");
    }

    #[test]
    fn duplicates_and_joins_go_to_rank_zero() {
        let cache = cache_with(&[0]);
        let mut p = PendingRequests::new(1);
        p.intake(vec![sub(0, 2)], &cache);
        p.intake(
            vec![
                sub(0, 2),
                Submission::new(
                    TensorId(3),
                    Params::new(RequestKind::Join, DataType::U8, []),
                ),
            ],
            &cache,
        );
        assert!(p.joined());
        assert_eq!(outbox_names(&mut p), ["a", "a", "j"]);
        p.end_join_round();
        assert!(!p.joined());
    }

    /// `count` tensors t0, t1, ... cached in slots 0, 1, ... (2 elements
    /// each), with their names.
    fn many_cached(count: u32) -> (Names, ResponseCache) {
        let mut names = Names::new();
        let mut cache = ResponseCache::new(count as usize);
        for id in 0..count {
            names.register(TensorId(id), &format!("t{id}")).unwrap();
            let name = names.shared(TensorId(id)).unwrap();
            cache.insert(
                name,
                Some(TensorId(id)),
                Arc::new(Response::error(format!("t{id}"), "")),
                Some(params(2)),
            );
        }
        (names, cache)
    }

    /// What a test can observe of a rank's pending requests.
    fn observed(
        p: &mut PendingRequests,
        names: &Names,
        count: u32,
    ) -> (Vec<usize>, usize, Vec<bool>, Vec<String>) {
        let pending = (0..count).map(|id| p.is_pending(TensorId(id))).collect();
        let outbox = p
            .take_outbox(names)
            .into_iter()
            .map(|r| r.tensor_name)
            .collect();
        (p.hit_slots(), p.len(), pending, outbox)
    }

    #[test]
    fn a_repeated_group_goes_in_and_out_as_one_until_something_changes() {
        let count = 8;
        let (_, cache) = many_cached(count);
        let mut p = PendingRequests::new(1);
        p.intake((0..count).map(|id| sub(id, 2)).collect::<Vec<_>>(), &cache);
        p.settle_hits(&(0..count as usize).collect::<Vec<_>>(), &mut Vec::new());
        let group: Arc<[TensorId]> = [5, 1, 3].iter().map(|&id| TensorId(id)).collect();
        let expected: Vec<Hit> = [1, 3, 5]
            .iter()
            .map(|&slot| Hit {
                slot,
                id: Some(TensorId(slot as u32)),
            })
            .collect();
        for step in 0..4 {
            assert!(p.intake_group(&group, &cache).is_empty());
            // The first step goes request by request and remembers the
            // group; the later ones go in as one.
            assert_eq!(p.lane, step > 0, "step {step}");
            assert_eq!((p.len(), p.hit_slots()), (3, vec![1, 3, 5]));
            assert!(p.is_pending(TensorId(3)) && !p.is_pending(TensorId(2)));
            let mut hits = Vec::new();
            p.settle_hits(&[1, 3, 5], &mut hits);
            assert_eq!(hits, expected);
            assert!(p.is_empty() && p.hit_slots().is_empty() && !p.lane);
        }
        // Another group object with the same ids is not the one remembered.
        let twin: Arc<[TensorId]> = group.iter().copied().collect();
        p.intake_group(&twin, &cache);
        assert!(!p.lane);
        p.settle_hits(&[1, 3, 5], &mut Vec::new());
        // Parameters sent for any id end the memo.
        p.intake_group(&twin, &cache);
        p.settle_hits(&[1, 3, 5], &mut Vec::new());
        p.intake(vec![sub(7, 2)], &cache);
        p.settle_hits(&[7], &mut Vec::new());
        p.intake_group(&twin, &cache);
        assert!(!p.lane, "the epoch changed");
        // Settled in part, the group is written out one by one: the rest
        // stays pending, and the next step sends the duplicates to rank 0.
        p.settle_hits(&[1, 3, 5], &mut Vec::new());
        p.intake_group(&twin, &cache);
        assert!(p.lane);
        let mut hits = Vec::new();
        p.settle_hits(&[3], &mut hits);
        assert_eq!(
            hits,
            vec![Hit {
                slot: 3,
                id: Some(TensorId(3))
            }]
        );
        assert!(!p.lane);
        assert_eq!((p.len(), p.hit_slots()), (2, vec![1, 5]));
    }

    use proptest::prelude::*;

    proptest! {
        /// The fast path of a repeat (no parameters) ends in the state the
        /// full path gives the same request with its parameters, and
        /// settling a set of slots at once equals settling them one by one.
        #[test]
        fn repeats_and_bulk_settles_match_the_one_by_one_path(
            order in proptest::sample::subsequence((0u32..96).collect::<Vec<u32>>(), 0..96)
                .prop_shuffle(),
            changed in proptest::collection::vec(0u32..96, 0..4),
            settle in proptest::sample::subsequence((0usize..96).collect::<Vec<usize>>(), 0..96),
        ) {
            let count = 96;
            let (names, cache) = many_cached(count);
            let mut warm = PendingRequests::new(1);
            // Every tensor once with its parameters: hits that leave each
            // id's slot remembered.
            warm.intake((0..count).map(|id| sub(id, 2)).collect::<Vec<_>>(), &cache);
            let all: Vec<usize> = (0..count as usize).collect();
            let mut hits = Vec::new();
            warm.settle_hits(&all, &mut hits);
            prop_assert!(warm.is_empty());
            let submissions = |fast: bool| -> Vec<Submission> {
                order.iter().map(|&id| {
                    if changed.contains(&id) {
                        sub(id, 3)
                    } else if fast {
                        Submission { id: TensorId(id), params: None }
                    } else {
                        sub(id, 2)
                    }
                }).collect()
            };
            let mut fast = warm.clone();
            let mut full = warm.clone();
            let invalid_fast = fast.intake(submissions(true), &cache);
            let invalid_full = full.intake(submissions(false), &cache);
            prop_assert_eq!(invalid_fast, invalid_full);
            // Every unchanged repeat is a hit on its own slot.
            let mut expected: Vec<usize> = order
                .iter()
                .filter(|id| !changed.contains(id))
                .map(|&id| id as usize)
                .collect();
            expected.sort_unstable();
            prop_assert_eq!(fast.hit_slots(), expected);
            let mut one_by_one = full.clone();
            prop_assert_eq!(observed(&mut fast.clone(), &names, count), observed(&mut full.clone(), &names, count));
            let mut bulk = Vec::new();
            full.settle_hits(&settle, &mut bulk);
            let single: Vec<Hit> = settle
                .iter()
                .map(|&slot| Hit { slot, id: one_by_one.settle_hit(slot) })
                .collect();
            prop_assert_eq!(bulk, single);
            prop_assert_eq!(observed(&mut full, &names, count), observed(&mut one_by_one, &names, count));
        }

        /// A repeated group handed over as one ([`Intake::Group`]) ends
        /// every step as the same group handed over request by request:
        /// settled whole, settled in part (the rest waits into the next
        /// step), partly invalidated, or after an unrelated id is
        /// forgotten; the same hits come out of every settle.
        #[test]
        fn groups_taken_in_as_one_match_the_one_by_one_path(
            order in proptest::sample::subsequence((0u32..48).collect::<Vec<u32>>(), 1..48)
                .prop_shuffle(),
            steps in proptest::collection::vec(
                (0usize..4, proptest::sample::subsequence((0usize..48).collect::<Vec<usize>>(), 0..48)),
                1..7,
            ),
        ) {
            let count = 48;
            let (names, cache) = many_cached(count);
            let mut warm = PendingRequests::new(1);
            warm.intake((0..count).map(|id| sub(id, 2)).collect::<Vec<_>>(), &cache);
            let all: Vec<usize> = (0..count as usize).collect();
            warm.settle_hits(&all, &mut Vec::new());
            let group: Arc<[TensorId]> = order.iter().map(|&id| TensorId(id)).collect();
            // Slot s holds id s: the group's slots, ascending.
            let mut whole: Vec<usize> = order.iter().map(|&id| id as usize).collect();
            whole.sort_unstable();
            let (mut lane, mut each) = (warm.clone(), warm);
            let seen = |p: &PendingRequests| observed(&mut p.clone(), &names, count);
            for (kind, part) in &steps {
                let invalid_lane = lane.intake_group(&group, &cache);
                let invalid_each = each.intake(group.iter().map(|&id| Submission::repeat(id)), &cache);
                prop_assert_eq!(invalid_lane, invalid_each);
                prop_assert_eq!(lane.hit_words(), each.hit_words());
                prop_assert_eq!(seen(&lane), seen(&each));
                let agreed: Vec<usize> = match kind {
                    0 => whole.clone(),
                    1 => part.clone(),
                    2 => {
                        // Some slots invalidated: their hits go to rank 0.
                        let bits = CycleBits { invalid: part.clone(), ..CycleBits::default() };
                        lane.route(&bits);
                        each.route(&bits);
                        prop_assert_eq!(seen(&lane), seen(&each));
                        whole.iter().copied().filter(|s| !part.contains(s)).collect()
                    }
                    _ => {
                        // An id outside the group, not pending, forgotten.
                        if let Some(other) = (0..count).find(|id| !order.contains(id)) {
                            lane.forget(TensorId(other));
                            each.forget(TensorId(other));
                        }
                        whole.clone()
                    }
                };
                let (mut out_lane, mut out_each) = (Vec::new(), Vec::new());
                lane.settle_hits(&agreed, &mut out_lane);
                each.settle_hits(&agreed, &mut out_each);
                prop_assert_eq!(out_lane, out_each);
                prop_assert_eq!(seen(&lane), seen(&each));
                // What went to rank 0 is answered there: both drop it.
                lane.take_outbox(&names);
                each.take_outbox(&names);
            }
        }
    }
}
