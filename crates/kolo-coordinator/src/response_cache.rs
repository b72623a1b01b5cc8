//! The response cache: responses that every rank performed before, kept in
//! numbered slots so that a repeated request can be agreed on with one bit
//! per slot instead of travelling to rank 0.
//!
//! Every rank holds its own cache, and the caches stay identical in their
//! slot assignment because they change only through the agreed response
//! sequence: [`ResponseCache::insert`] after a successful response,
//! [`ResponseCache::touch`] after a cache hit, [`ResponseCache::erase`] for
//! the slots whose invalid bit was OR-ed in. What differs per rank is the
//! request parameters stored with each slot: a rank's own request for the
//! tensor (allgather and alltoall parameters differ between ranks), which is
//! what a later request on that rank must equal to hit.

use kolo_protocol::{Request, Response};
use std::collections::{BTreeSet, HashMap};

/// What [`ResponseCache::lookup`] found for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The name is cached with exactly these parameters: the slot's bit may
    /// be set.
    Hit(usize),
    /// The name is cached with other parameters (or without parameters on
    /// this rank): the slot must be invalidated on every rank.
    Mismatch(usize),
    /// The name is not cached.
    Miss,
}

/// One cached response.
#[derive(Clone, Debug)]
struct Entry {
    name: String,
    response: Response,
    /// This rank's request for the tensor when the response was performed;
    /// `None` when this rank did not submit it (such an entry never hits here).
    params: Option<Request>,
    /// Logical time of the last insert or hit (for LRU eviction).
    last_used: u64,
}

/// A fixed-capacity cache of responses with deterministic slot assignment and
/// least-recently-used eviction.
#[derive(Clone, Debug, Default)]
pub struct ResponseCache {
    slots: Vec<Option<Entry>>,
    by_name: HashMap<String, usize>,
    /// The empty slots, lowest first.
    free: BTreeSet<usize>,
    /// `(last_used, slot)` of every occupied slot: the first is the least
    /// recently used (O(log n) eviction instead of a scan of every slot).
    lru: BTreeSet<(u64, usize)>,
    clock: u64,
    /// Bumped whenever a slot's tensor or parameters change (insert,
    /// erase): pending hits need revalidating only then.
    generation: u64,
}

/// True when `a` and `b` ask for the same collective on the same tensor: the
/// name and every parameter (kind, dtype, shape, device, root, reduce op,
/// scale factors compared bit for bit, splits) are equal. The rank is not a
/// parameter.
pub fn same_params(a: &Request, b: &Request) -> bool {
    a.tensor_name == b.tensor_name
        && a.kind == b.kind
        && a.dtype == b.dtype
        && a.shape == b.shape
        && a.device == b.device
        && a.root_rank == b.root_rank
        && a.reduce_op == b.reduce_op
        && a.prescale.to_bits() == b.prescale.to_bits()
        && a.postscale.to_bits() == b.postscale.to_bits()
        && a.splits == b.splits
}

impl ResponseCache {
    /// A cache of `capacity` slots; 0 makes a cache that stores nothing.
    pub fn new(capacity: usize) -> Self {
        ResponseCache {
            slots: vec![None; capacity],
            by_name: HashMap::new(),
            free: (0..capacity).collect(),
            lru: BTreeSet::new(),
            clock: 0,
            generation: 0,
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
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

    /// Looks `request` up by its name and compares every parameter.
    pub fn lookup(&self, request: &Request) -> Lookup {
        match self.by_name.get(&request.tensor_name) {
            None => Lookup::Miss,
            Some(&slot) if self.matches(slot, request) => Lookup::Hit(slot),
            Some(&slot) => Lookup::Mismatch(slot),
        }
    }

    /// True when `slot` holds `request`'s name with exactly its parameters.
    pub fn matches(&self, slot: usize, request: &Request) -> bool {
        match self.slots.get(slot) {
            Some(Some(entry)) => entry
                .params
                .as_ref()
                .is_some_and(|params| same_params(params, request)),
            _ => false,
        }
    }

    /// Changes whenever a slot's tensor or parameters change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The response cached in `slot`.
    pub fn response(&self, slot: usize) -> Option<&Response> {
        self.slots.get(slot)?.as_ref().map(|entry| &entry.response)
    }

    /// The tensor name cached in `slot`.
    pub fn name(&self, slot: usize) -> Option<&str> {
        self.slots
            .get(slot)?
            .as_ref()
            .map(|entry| entry.name.as_str())
    }

    /// The slot holding `name`.
    pub fn slot_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Marks `slot` as used now (after a cache hit).
    pub fn touch(&mut self, slot: usize) {
        self.clock += 1;
        let clock = self.clock;
        if let Some(Some(entry)) = self.slots.get_mut(slot) {
            self.lru.remove(&(entry.last_used, slot));
            self.lru.insert((clock, slot));
            entry.last_used = clock;
        }
    }

    /// Stores `response` for `name` with this rank's `params` and returns its
    /// slot: the slot already holding `name`, else the lowest free slot, else
    /// the least recently used one (evicted). `None` when the capacity is 0.
    pub fn insert(
        &mut self,
        name: &str,
        response: Response,
        params: Option<Request>,
    ) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let slot = match self.by_name.get(name) {
            Some(&slot) => slot,
            None => match self.free.first().copied() {
                Some(free) => free,
                None => self.evict_lru()?,
            },
        };
        self.clock += 1;
        self.generation += 1;
        self.free.remove(&slot);
        if let Some(Some(old)) = self.slots.get(slot) {
            self.lru.remove(&(old.last_used, slot));
        }
        self.lru.insert((self.clock, slot));
        self.by_name.insert(name.to_owned(), slot);
        self.slots[slot] = Some(Entry {
            name: name.to_owned(),
            response,
            params,
            last_used: self.clock,
        });
        Some(slot)
    }

    /// Empties `slot` (its name was requested with other parameters
    /// somewhere, or it stalled on the cache path).
    pub fn erase(&mut self, slot: usize) {
        if let Some(entry) = self.slots.get_mut(slot).and_then(Option::take) {
            self.generation += 1;
            self.by_name.remove(&entry.name);
            self.lru.remove(&(entry.last_used, slot));
            self.free.insert(slot);
        }
    }

    /// Empties the least recently used slot (lowest slot on a tie) and
    /// returns it.
    fn evict_lru(&mut self) -> Option<usize> {
        let (_, slot) = self.lru.first().copied()?;
        self.erase(slot);
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::{DataType, RequestKind};
    use proptest::prelude::*;

    fn req(name: &str, len: u64) -> Request {
        Request::new(0, name, RequestKind::Allreduce, DataType::F32, vec![len])
    }

    fn resp(name: &str) -> Response {
        Response::error(name, "")
    }

    #[test]
    fn hit_needs_every_parameter() {
        let mut cache = ResponseCache::new(4);
        let slot = cache
            .insert("a", resp("a"), Some(req("a", 3)))
            .unwrap_or(usize::MAX);
        assert_eq!(cache.lookup(&req("a", 3)), Lookup::Hit(slot));
        assert_eq!(cache.lookup(&req("a", 4)), Lookup::Mismatch(slot));
        let scaled = Request {
            postscale: 0.5,
            ..req("a", 3)
        };
        assert_eq!(cache.lookup(&scaled), Lookup::Mismatch(slot));
        assert_eq!(cache.lookup(&req("b", 3)), Lookup::Miss);
    }

    #[test]
    fn entry_without_params_never_hits() {
        let mut cache = ResponseCache::new(2);
        let slot = cache.insert("a", resp("a"), None);
        assert_eq!(slot, Some(0));
        assert_eq!(cache.lookup(&req("a", 3)), Lookup::Mismatch(0));
    }

    #[test]
    fn lru_eviction_and_erase() {
        let mut cache = ResponseCache::new(2);
        assert_eq!(cache.insert("a", resp("a"), Some(req("a", 1))), Some(0));
        assert_eq!(cache.insert("b", resp("b"), Some(req("b", 1))), Some(1));
        cache.touch(0);
        // "b" is least recently used now.
        assert_eq!(cache.insert("c", resp("c"), Some(req("c", 1))), Some(1));
        assert_eq!(cache.slot_of("b"), None);
        assert_eq!(cache.name(1), Some("c"));
        cache.erase(0);
        assert_eq!(cache.lookup(&req("a", 1)), Lookup::Miss);
        assert_eq!(cache.insert("d", resp("d"), None), Some(0));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn zero_capacity_stores_nothing() {
        let mut cache = ResponseCache::new(0);
        assert_eq!(cache.insert("a", resp("a"), Some(req("a", 1))), None);
        assert_eq!(cache.lookup(&req("a", 1)), Lookup::Miss);
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
        /// Two caches fed the same operation sequence (what every rank does
        /// with the agreed responses) assign the same slots, whatever the
        /// per-rank parameters are; the name index always agrees with the
        /// slots and the capacity is never exceeded.
        #[test]
        fn slots_match_a_scanning_reference(ops in prop::collection::vec(op(), 0..120), cap in 0usize..6) {
            // The reference: lowest free slot by a scan, else the least
            // recently used by a scan (lowest slot on a tie).
            let mut reference: Vec<Option<(String, u64)>> = vec![None; cap];
            let mut clock = 0u64;
            let mut cache = ResponseCache::new(cap);
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
                        prop_assert_eq!(cache.insert(&name, resp(&name), None), expected);
                    }
                    Op::Touch(s) => {
                        clock += 1;
                        if let Some(Some((_, t))) = reference.get_mut(s) {
                            *t = clock;
                        }
                        cache.touch(s);
                    }
                    Op::Erase(s) => {
                        if let Some(e) = reference.get_mut(s) {
                            *e = None;
                        }
                        cache.erase(s);
                    }
                }
                for (slot, entry) in reference.iter().enumerate() {
                    prop_assert_eq!(cache.name(slot), entry.as_ref().map(|(m, _)| m.as_str()));
                }
            }
        }

        #[test]
        fn same_sequence_same_slots(ops in prop::collection::vec(op(), 0..80), cap in 0usize..6) {
            let mut a = ResponseCache::new(cap);
            let mut b = ResponseCache::new(cap);
            for op in ops {
                match op {
                    Op::Insert(n) => {
                        let name = format!("t{n}");
                        let sa = a.insert(&name, resp(&name), Some(req(&name, 1)));
                        let sb = b.insert(&name, resp(&name), None);
                        prop_assert_eq!(sa, sb);
                    }
                    Op::Touch(s) => { a.touch(s); b.touch(s); }
                    Op::Erase(s) => { a.erase(s); b.erase(s); }
                }
                prop_assert!(a.len() <= cap);
                for slot in 0..cap {
                    prop_assert_eq!(a.name(slot), b.name(slot));
                    if let Some(name) = a.name(slot) {
                        prop_assert_eq!(a.slot_of(name), Some(slot));
                    }
                }
            }
        }
    }
}
