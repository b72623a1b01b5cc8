//! The response cache: responses that every rank performed before, kept in
//! numbered slots so that a repeated request can be agreed on with one bit
//! per slot instead of travelling to rank 0.
//!
//! Every rank holds its own cache, and the caches stay identical in their
//! slot assignment because they change only through the agreed response
//! sequence: [`ResponseCache::insert`] after a successful response,
//! [`ResponseCache::touch`] after a cache hit, [`ResponseCache::erase`] for
//! the slots whose invalid bit was OR-ed in. What differs per rank is what
//! each slot remembers of the rank itself: its [`TensorId`] for the tensor
//! and its own request parameters (allgather and alltoall parameters
//! differ between ranks), which a later request on that rank must equal to
//! hit.
//!
//! Everything on the hit path is an array access by id or slot: a lookup
//! by [`TensorId`], a parameter comparison, a least-recently-used list
//! linked through the slots (O(1) touch and eviction), and responses
//! shared (`Arc`), not copied.
//!
//! Nothing is sized by the capacity: the slots are handed out lowest first
//! and the cache's tables grow with them, so its memory and the length of
//! each cycle's bit vector follow the slots in use ([`ResponseCache::extent`],
//! the same on every rank), not the capacity, which only says when to
//! start evicting.

use crate::lru::Lru;
use crate::names::TensorId;
use kolo_protocol::{Params, Response};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// What [`ResponseCache::lookup`] found for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The tensor is cached with exactly these parameters: the slot's bit
    /// may be set.
    Hit(usize),
    /// The tensor is cached with other parameters (or without parameters
    /// of this rank): the slot must be invalidated on every rank.
    Mismatch(usize),
    /// The tensor is not cached.
    Miss,
}

/// One cached response.
#[derive(Clone, Debug)]
struct Entry {
    name: Arc<str>,
    /// This rank's id for the tensor; `None` when this rank did not submit
    /// it (such an entry never hits here).
    id: Option<TensorId>,
    /// This rank's parameters when the response was performed.
    params: Option<Params>,
}

/// The largest capacity a cache takes (larger ones are clamped to it):
/// slots are numbered in `u32`s, `u32::MAX` meaning "none".
pub const MAX_CAPACITY: usize = u32::MAX as usize;

/// A bounded cache of responses with deterministic slot assignment and
/// least-recently-used eviction.
#[derive(Clone, Debug)]
pub struct ResponseCache {
    /// The most slots the cache hands out.
    capacity: usize,
    /// The slots handed out so far, `0..extent`: occupied, or emptied
    /// since (then in `free`).
    slots: Vec<Option<Entry>>,
    /// The response of each occupied slot, apart from the rest of the
    /// entry: a cycle's hits read only these, densely.
    responses: Vec<Option<Arc<Response>>>,
    by_name: HashMap<Arc<str>, usize>,
    /// Slot of each of this rank's ids.
    by_id: Vec<Option<usize>>,
    /// The slots handed out and emptied since, lowest first.
    free: BTreeSet<usize>,
    /// The occupied slots, least recently used first.
    lru: Lru,
    /// Bumped whenever a slot's tensor or parameters change (insert,
    /// erase): pending hits need revalidating only then.
    generation: u64,
    /// Slots that eviction skips (a cycle's hits, performed after it from
    /// the cache), ascending.
    pinned: Vec<usize>,
}

impl Default for ResponseCache {
    fn default() -> Self {
        ResponseCache::new(0)
    }
}

impl ResponseCache {
    /// A cache of at most `capacity` slots (clamped to [`MAX_CAPACITY`]);
    /// 0 makes a cache that stores nothing. Allocates nothing up front.
    pub fn new(capacity: usize) -> Self {
        ResponseCache {
            capacity: capacity.min(MAX_CAPACITY),
            slots: Vec::new(),
            responses: Vec::new(),
            by_name: HashMap::new(),
            by_id: Vec::new(),
            free: BTreeSet::new(),
            lru: Lru::default(),
            generation: 0,
            pinned: Vec::new(),
        }
    }

    /// The most slots the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The slots handed out so far: every slot in use is below it. It
    /// grows by one with each insert that finds no emptied slot to reuse,
    /// up to the capacity, and never shrinks; it changes only with
    /// [`ResponseCache::insert`], so it is the same on every rank, and
    /// each cycle's bit vector covers these slots.
    pub fn extent(&self) -> usize {
        self.slots.len()
    }

    /// Number of occupied slots.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// True when no slot is occupied.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Looks up this rank's tensor `id` and compares its parameters.
    pub fn lookup(&self, id: TensorId, params: &Params) -> Lookup {
        match self.slot_of_id(id) {
            None => Lookup::Miss,
            Some(slot) if self.matches(slot, id, params) => Lookup::Hit(slot),
            Some(slot) => Lookup::Mismatch(slot),
        }
    }

    /// True when `slot` holds this rank's tensor `id` with exactly
    /// `params`.
    pub fn matches(&self, slot: usize, id: TensorId, params: &Params) -> bool {
        match self.slots.get(slot) {
            Some(Some(entry)) => {
                entry.id == Some(id)
                    && entry
                        .params
                        .as_ref()
                        .is_some_and(|mine| mine.same_as(params))
            }
            _ => false,
        }
    }

    /// Changes whenever a slot's tensor or parameters change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The response cached in `slot`.
    pub fn response(&self, slot: usize) -> Option<&Arc<Response>> {
        self.responses.get(slot)?.as_ref()
    }

    /// The tensor name cached in `slot`.
    pub fn name(&self, slot: usize) -> Option<&str> {
        self.slots.get(slot)?.as_ref().map(|entry| &*entry.name)
    }

    /// The tensor name cached in `slot`, shareable.
    pub fn shared_name(&self, slot: usize) -> Option<&Arc<str>> {
        self.slots.get(slot)?.as_ref().map(|entry| &entry.name)
    }

    /// This rank's id for the tensor cached in `slot`.
    pub fn id(&self, slot: usize) -> Option<TensorId> {
        self.slots.get(slot)?.as_ref()?.id
    }

    /// The slot holding `name`.
    pub fn slot_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The slot holding this rank's tensor `id`.
    pub fn slot_of_id(&self, id: TensorId) -> Option<usize> {
        self.by_id.get(id.index()).copied().flatten()
    }

    /// Keeps `slots` (ascending) from being evicted until
    /// [`ResponseCache::unpin_all`] (every rank pins the same slots:
    /// eviction stays deterministic).
    pub fn pin(&mut self, slots: &[usize]) {
        if self.pinned.is_empty() {
            self.pinned.extend_from_slice(slots);
        } else {
            self.pinned.extend_from_slice(slots);
            self.pinned.sort_unstable();
            self.pinned.dedup();
        }
    }

    /// True when `slot` is pinned.
    fn is_pinned(&self, slot: usize) -> bool {
        self.pinned.binary_search(&slot).is_ok()
    }

    /// Lets every pinned slot be evicted again.
    pub fn unpin_all(&mut self) {
        self.pinned.clear();
    }

    /// Marks `slots` (ascending) as used now, in that order (after cache
    /// hits). When they already are the most recently used, in that order
    /// (a training step repeating the last), the list is left as it is:
    /// relinking would rebuild it unchanged.
    pub fn touch_all(&mut self, slots: &[usize]) {
        if self.lru.touched_last(slots) {
            return;
        }
        if !self.lru.ends_with(slots) {
            for &slot in slots {
                self.touch(slot);
            }
        }
        // Only occupied slots are linked: then the list ends with them.
        if slots.iter().all(|&slot| self.name(slot).is_some()) {
            self.lru.remember_touched(slots);
        }
    }

    /// Marks `slot` as used now (after a cache hit).
    pub fn touch(&mut self, slot: usize) {
        if let Some(Some(_)) = self.slots.get(slot) {
            self.lru.unlink(slot);
            self.lru.push_back(slot);
        }
    }

    /// Stores `response` for `name` with this rank's `id` and `params` for
    /// it and returns its slot: the slot already holding `name`, else the
    /// lowest free slot, else the least recently used one that is not
    /// pinned (evicted). `None` when the capacity is 0 or every occupied
    /// slot is pinned.
    pub fn insert(
        &mut self,
        name: &Arc<str>,
        id: Option<TensorId>,
        response: Arc<Response>,
        params: Option<Params>,
    ) -> Option<usize> {
        if self.capacity == 0 {
            return None;
        }
        let slot = match self.by_name.get(&**name) {
            Some(&slot) => {
                self.lru.unlink(slot);
                self.unmap_id(slot);
                slot
            }
            // Every slot not handed out yet is above every emptied one:
            // the lowest empty slot is the lowest emptied one, if any.
            None => match self.free.pop_first() {
                Some(free) => free,
                None if self.slots.len() < self.capacity => {
                    let fresh = self.slots.len();
                    self.slots.push(None);
                    self.responses.push(None);
                    self.lru.grow(fresh + 1);
                    fresh
                }
                None => {
                    let victim = self.lru.first_where(|slot| !self.is_pinned(slot))?;
                    self.erase(victim);
                    self.free.remove(&victim);
                    victim
                }
            },
        };
        self.generation += 1;
        self.lru.push_back(slot);
        self.by_name.insert(Arc::clone(name), slot);
        if let Some(id) = id {
            if self.by_id.len() <= id.index() {
                self.by_id.resize(id.index() + 1, None);
            }
            self.by_id[id.index()] = Some(slot);
        }
        self.slots[slot] = Some(Entry {
            name: Arc::clone(name),
            id,
            params,
        });
        self.responses[slot] = Some(response);
        Some(slot)
    }

    /// Empties `slot` (its tensor was requested with other parameters
    /// somewhere, or it stalled on the cache path).
    pub fn erase(&mut self, slot: usize) {
        if let Some(Some(_)) = self.slots.get(slot) {
            self.unmap_id(slot);
            self.responses[slot] = None;
            if let Some(entry) = self.slots[slot].take() {
                self.generation += 1;
                self.by_name.remove(&entry.name);
                self.lru.unlink(slot);
                self.free.insert(slot);
            }
        }
    }

    /// Clears the id index of `slot`'s entry.
    fn unmap_id(&mut self, slot: usize) {
        let id = self.id(slot);
        if let Some(entry) = id.and_then(|id| self.by_id.get_mut(id.index())) {
            *entry = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::{DataType, RequestKind};
    use proptest::prelude::*;

    fn params(len: u64) -> Params {
        Params::new(RequestKind::Allreduce, DataType::F32, [len])
    }

    fn resp(name: &str) -> Arc<Response> {
        Arc::new(Response::error(name, ""))
    }

    fn put(
        cache: &mut ResponseCache,
        name: &str,
        id: Option<u32>,
        params: Option<Params>,
    ) -> Option<usize> {
        cache.insert(&Arc::from(name), id.map(TensorId), resp(name), params)
    }

    #[test]
    fn hit_needs_the_id_and_every_parameter() {
        let mut cache = ResponseCache::new(4);
        let slot = put(&mut cache, "a", Some(7), Some(params(3))).unwrap_or(usize::MAX);
        assert_eq!(cache.lookup(TensorId(7), &params(3)), Lookup::Hit(slot));
        assert_eq!(
            cache.lookup(TensorId(7), &params(4)),
            Lookup::Mismatch(slot)
        );
        let scaled = Params {
            postscale: 0.5,
            ..params(3)
        };
        assert_eq!(cache.lookup(TensorId(7), &scaled), Lookup::Mismatch(slot));
        assert_eq!(cache.lookup(TensorId(8), &params(3)), Lookup::Miss);
        assert_eq!(cache.slot_of("a"), Some(slot));
        assert_eq!(cache.id(slot), Some(TensorId(7)));
    }

    #[test]
    fn entry_without_params_never_hits() {
        let mut cache = ResponseCache::new(2);
        assert_eq!(put(&mut cache, "a", Some(1), None), Some(0));
        assert_eq!(cache.lookup(TensorId(1), &params(3)), Lookup::Mismatch(0));
        assert_eq!(put(&mut cache, "b", None, None), Some(1));
        assert_eq!(cache.slot_of_id(TensorId(1)), Some(0));
    }

    #[test]
    fn lru_eviction_and_erase() {
        let mut cache = ResponseCache::new(2);
        assert_eq!(put(&mut cache, "a", Some(0), Some(params(1))), Some(0));
        assert_eq!(put(&mut cache, "b", Some(1), Some(params(1))), Some(1));
        cache.touch(0);
        // "b" is least recently used now.
        assert_eq!(put(&mut cache, "c", Some(2), Some(params(1))), Some(1));
        assert_eq!(cache.slot_of("b"), None);
        assert_eq!(cache.slot_of_id(TensorId(1)), None);
        assert_eq!(cache.name(1), Some("c"));
        cache.erase(0);
        assert_eq!(cache.lookup(TensorId(0), &params(1)), Lookup::Miss);
        assert_eq!(put(&mut cache, "d", None, None), Some(0));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn pinned_slots_are_not_evicted() {
        let mut cache = ResponseCache::new(2);
        assert_eq!(put(&mut cache, "a", Some(0), Some(params(1))), Some(0));
        assert_eq!(put(&mut cache, "b", Some(1), Some(params(1))), Some(1));
        cache.pin(&[0]);
        assert_eq!(put(&mut cache, "c", Some(2), Some(params(1))), Some(1));
        cache.pin(&[1]);
        assert_eq!(put(&mut cache, "d", Some(3), Some(params(1))), None);
        assert_eq!((cache.name(0), cache.name(1)), (Some("a"), Some("c")));
        cache.unpin_all();
        assert_eq!(put(&mut cache, "d", Some(3), Some(params(1))), Some(0));
    }

    #[test]
    fn zero_capacity_stores_nothing() {
        let mut cache = ResponseCache::new(0);
        assert_eq!(put(&mut cache, "a", Some(0), Some(params(1))), None);
        assert_eq!(cache.lookup(TensorId(0), &params(1)), Lookup::Miss);
        cache.touch(0);
        cache.erase(0);
        assert!(cache.is_empty());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u8),
        Touch(usize),
        Erase(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..12).prop_map(Op::Insert),
            (0usize..6).prop_map(Op::Touch),
            (0usize..6).prop_map(Op::Erase),
        ]
    }

    proptest! {
        /// Touching several slots at once orders the list as touching them
        /// one by one, round after round of other operations in between
        /// (a repeated touch is known without a walk while the order is
        /// unchanged), empty slots among them or not.
        #[test]
        fn touch_all_is_touching_each(
            rounds in prop::collection::vec(
                (prop::collection::vec(op(), 0..30), prop::collection::btree_set(0usize..6, 0..6), any::<bool>()),
                1..6,
            ),
        ) {
            let mut a = ResponseCache::new(6);
            let mut b = ResponseCache::new(6);
            for (ops, touched, occupied_only) in rounds {
                for op in ops {
                    match op {
                        Op::Insert(n) => {
                            let name = format!("t{n}");
                            prop_assert_eq!(put(&mut a, &name, None, None), put(&mut b, &name, None, None));
                        }
                        Op::Touch(s) => { a.touch(s); b.touch(s); }
                        Op::Erase(s) => { a.erase(s); b.erase(s); }
                    }
                }
                let touched: Vec<usize> = touched
                    .into_iter()
                    .filter(|&s| !occupied_only || a.name(s).is_some())
                    .collect();
                a.touch_all(&touched);
                a.touch_all(&touched);
                for &s in &touched { b.touch(s); }
                // Same eviction order from here: fill with new names.
                let (mut a2, mut b2) = (a.clone(), b.clone());
                for n in 100..110 {
                    let name = format!("t{n}");
                    prop_assert_eq!(put(&mut a2, &name, None, None), put(&mut b2, &name, None, None));
                }
            }
        }

        /// Two caches fed the same operation sequence (what every rank does
        /// with the agreed responses) assign the same slots, whatever the
        /// per-rank ids and parameters are; the name and id indexes always
        /// agree with the slots and the capacity is never exceeded.
        #[test]
        fn slots_match_a_scanning_reference(ops in prop::collection::vec(op(), 0..120), cap in 0usize..6) {
            // The reference: lowest free slot by a scan, else the least
            // recently used by a scan (lowest slot on a tie).
            let mut reference: Vec<Option<(String, u64)>> = vec![None; cap];
            let mut clock = 0u64;
            let mut cache = ResponseCache::new(cap);
            let mut other = ResponseCache::new(cap);
            for op in ops {
                match op {
                    Op::Insert(n) => {
                        let name = format!("t{n}");
                        let expected = if cap == 0 {
                            None
                        } else {
                            let slot = reference
                                .iter()
                                .position(|e| e.as_ref().is_some_and(|(m, _)| *m == name))
                                .or_else(|| reference.iter().position(Option::is_none))
                                .or_else(|| {
                                    reference
                                        .iter()
                                        .enumerate()
                                        .filter_map(|(i, e)| e.as_ref().map(|(_, t)| (*t, i)))
                                        .min()
                                        .map(|(_, i)| i)
                                });
                            if let Some(slot) = slot {
                                clock += 1;
                                reference[slot] = Some((name.clone(), clock));
                            }
                            slot
                        };
                        prop_assert_eq!(put(&mut cache, &name, Some(u32::from(n)), Some(params(1))), expected);
                        // Another rank: other ids, no parameters.
                        prop_assert_eq!(put(&mut other, &name, Some(u32::from(n) * 7 + 1), None), expected);
                    }
                    Op::Touch(s) => {
                        clock += 1;
                        if let Some(Some((_, t))) = reference.get_mut(s) {
                            *t = clock;
                        }
                        cache.touch(s);
                        other.touch(s);
                    }
                    Op::Erase(s) => {
                        if let Some(e) = reference.get_mut(s) {
                            *e = None;
                        }
                        cache.erase(s);
                        other.erase(s);
                    }
                }
                prop_assert!(cache.len() <= cap);
                for (slot, entry) in reference.iter().enumerate() {
                    let name = entry.as_ref().map(|(m, _)| m.as_str());
                    prop_assert_eq!(cache.name(slot), name);
                    prop_assert_eq!(other.name(slot), name);
                    if let Some(name) = name {
                        prop_assert_eq!(cache.slot_of(name), Some(slot));
                        let id = cache.id(slot).expect("inserted with an id");
                        prop_assert_eq!(cache.slot_of_id(id), Some(slot));
                        prop_assert_eq!(cache.lookup(id, &params(1)), Lookup::Hit(slot));
                    }
                }
                for n in 0u32..12 {
                    let name = format!("t{n}");
                    prop_assert_eq!(cache.slot_of_id(TensorId(n)), cache.slot_of(&name));
                }
            }
        }
    }
}
