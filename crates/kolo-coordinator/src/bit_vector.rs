//! The bit vector every rank contributes to a cycle, reduced with a single
//! `bitwise_allreduce(And)`.
//!
//! The cache-hit bits need an AND across ranks (a response is agreed only
//! when every rank has the request); everything else needs an OR (did *any*
//! rank ask for shutdown, join, have uncached requests, invalidate a slot,
//! have a hit). Since `OR(x) = !AND(!x)`, the OR part is stored inverted and
//! one AND-allreduce answers both: one control-plane call per cycle on the
//! fast path.
//!
//! The slot groups cover the cache's slots in use (its
//! [`extent`](crate::response_cache::ResponseCache::extent)), not its
//! capacity: a cycle costs what the cache holds. Every rank's cache hands
//! out the same slots, so every rank contributes the same length, as long
//! as every rank has the same capacity, which every cycle checks: each
//! rank's capacity is both AND-ed and OR-ed, and the two agree only when
//! every rank gave the same.
//!
//! Layout (in `u64` words, bit `i` of a group is bit `i % 64` of word
//! `i / 64` of that group):
//!
//! | group          | bits    | reduced |
//! |----------------|---------|---------|
//! | cache hits     | `slots` | AND     |
//! | cache capacity | 64      | AND     |
//! | shutdown ranks | `size`  | OR      |
//! | joined ranks   | `size`  | OR      |
//! | flags          | 64      | OR      |
//! | cache capacity | 64      | OR      |
//! | invalid slots  | `slots` | OR      |
//! | any-rank hits  | `slots` | OR      |

/// Flag bit: this rank has requests for rank 0 (not settled by the cache).
const FLAG_UNCACHED: usize = 0;
/// Flag bit: rank 0 needs a gather this cycle (stall errors to broadcast).
const FLAG_GATHER: usize = 1;

/// What one rank contributes to a cycle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalBits {
    /// This rank wants to shut down.
    pub shutdown: bool,
    /// This rank has joined.
    pub joined: bool,
    /// This rank has requests that must travel to rank 0.
    pub uncached: bool,
    /// (Rank 0) the coordinator needs a gather this cycle.
    pub gather: bool,
    /// This rank's response cache capacity (every rank must have the same).
    pub cache_capacity: usize,
    /// Cache slots whose name this rank requested with other parameters.
    pub invalid: Vec<usize>,
    /// Cache slots this rank has a pending matching request for.
    pub hits: Vec<usize>,
}

/// What every rank learns from the reduced vector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CycleBits {
    /// Ranks that asked for shutdown, ascending.
    pub shutdown_ranks: Vec<u32>,
    /// Ranks that have joined, ascending.
    pub joined_ranks: Vec<u32>,
    /// Some rank has requests for rank 0.
    pub any_uncached: bool,
    /// Rank 0 asked for a gather.
    pub gather_requested: bool,
    /// Some ranks have another cache capacity than others: the ranks
    /// would disagree on the slots (and the bit vector's length) once a
    /// cache fills.
    pub cache_capacities_differ: bool,
    /// Slots to invalidate on every rank, ascending.
    pub invalid: Vec<usize>,
    /// Slots every rank has a hit for, ascending.
    pub hits_all: Vec<usize>,
    /// Slots some rank has a hit for, ascending.
    pub hits_any: Vec<usize>,
}

impl CycleBits {
    /// Some rank has joined: the cache path pauses (see [`crate::join`]).
    pub fn any_joined(&self) -> bool {
        !self.joined_ranks.is_empty()
    }

    /// Every one of `size` ranks has joined: the join round ends.
    pub fn everyone_joined(&self, size: usize) -> bool {
        size > 0 && self.joined_ranks.len() == size
    }

    /// The cache slots whose responses every rank performs now, ascending:
    /// hits every rank has, not invalidated, none while a rank is joined.
    pub fn agreed_hits(&self) -> Vec<usize> {
        if self.any_joined() {
            return Vec::new();
        }
        if self.invalid.is_empty() {
            return self.hits_all.clone();
        }
        let valid = |slot: &usize| self.invalid.binary_search(slot).is_err();
        self.hits_all.iter().copied().filter(valid).collect()
    }

    /// Request lists must travel to rank 0 this cycle: some rank has
    /// requests for it, rank 0 asked (stall errors to send), slots were
    /// invalidated (their pending hits move to rank 0), hits wait while a
    /// rank is joined (they move too), or the join round ends.
    pub fn needs_gather(&self, size: usize) -> bool {
        self.any_uncached
            || self.gather_requested
            || !self.invalid.is_empty()
            || (self.any_joined() && !self.hits_any.is_empty())
            || self.everyone_joined(size)
    }
}

/// Word offsets of the groups for one (world size, cache slots in use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitLayout {
    size: usize,
    slots: usize,
}

fn words_for(bits: usize) -> usize {
    bits.div_ceil(64)
}

fn set(words: &mut [u64], start: usize, bit: usize) {
    if let Some(word) = words.get_mut(start + bit / 64) {
        *word |= 1u64 << (bit % 64);
    }
}

/// How many of the first `count` bits of the group at `start` are set.
fn count_ones(words: &[u64], start: usize, count: usize) -> usize {
    let group = words.get(start..).unwrap_or(&[]);
    let full = count / 64;
    let mut n: usize = group
        .iter()
        .take(full)
        .map(|w| w.count_ones() as usize)
        .sum();
    if count % 64 != 0 {
        if let Some(last) = group.get(full) {
            n += (last & ((1u64 << (count % 64)) - 1)).count_ones() as usize;
        }
    }
    n
}

/// The set bits among the first `count` of the group at `start`, ascending
/// (word by word: a cycle's decode costs the set bits, not the slots).
fn ones(words: &[u64], start: usize, count: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(count_ones(words, start, count));
    let group = words.get(start..).unwrap_or(&[]);
    for (w, &word) in group.iter().take(words_for(count)).enumerate() {
        let mut rest = word;
        while rest != 0 {
            let bit = w * 64 + rest.trailing_zeros() as usize;
            if bit >= count {
                break;
            }
            out.push(bit);
            rest &= rest - 1;
        }
    }
    out
}

impl BitLayout {
    /// The layout for `size` ranks and the cache slots `0..slots`.
    pub fn new(size: usize, slots: usize) -> Self {
        BitLayout { size, slots }
    }

    fn cache_words(&self) -> usize {
        words_for(self.slots)
    }

    fn capacity_and(&self) -> usize {
        self.cache_words()
    }

    fn rank_words(&self) -> usize {
        words_for(self.size)
    }

    /// Start of the OR part (everything after the AND-reduced words).
    fn or_start(&self) -> usize {
        self.capacity_and() + 1
    }

    fn shutdown_start(&self) -> usize {
        self.or_start()
    }

    fn joined_start(&self) -> usize {
        self.shutdown_start() + self.rank_words()
    }

    fn flags_start(&self) -> usize {
        self.joined_start() + self.rank_words()
    }

    fn capacity_or(&self) -> usize {
        self.flags_start() + 1
    }

    fn invalid_start(&self) -> usize {
        self.capacity_or() + 1
    }

    fn hits_any_start(&self) -> usize {
        self.invalid_start() + self.cache_words()
    }

    /// Total number of words.
    pub fn len(&self) -> usize {
        self.hits_any_start() + self.cache_words()
    }

    /// Never true: the flags and capacity words are always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The words `rank` contributes (out-of-range ranks and slots are
    /// dropped).
    pub fn encode(&self, rank: usize, local: &LocalBits) -> Vec<u64> {
        let mut words = vec![0u64; self.len()];
        for &slot in local.hits.iter().filter(|&&s| s < self.slots) {
            set(&mut words, 0, slot);
            set(&mut words, self.hits_any_start(), slot);
        }
        if rank < self.size {
            if local.shutdown {
                set(&mut words, self.shutdown_start(), rank);
            }
            if local.joined {
                set(&mut words, self.joined_start(), rank);
            }
        }
        if local.uncached {
            set(&mut words, self.flags_start(), FLAG_UNCACHED);
        }
        if local.gather {
            set(&mut words, self.flags_start(), FLAG_GATHER);
        }
        for &slot in local.invalid.iter().filter(|&&s| s < self.slots) {
            set(&mut words, self.invalid_start(), slot);
        }
        let capacity = local.cache_capacity as u64;
        words[self.capacity_and()] = capacity;
        words[self.capacity_or()] = capacity;
        for word in &mut words[self.or_start()..] {
            *word = !*word;
        }
        words
    }

    /// [`BitLayout::encode`] with the hit bits given as a bit set
    /// (`hits`: bit `s % 64` of word `s / 64` for slot `s`; `local.hits`
    /// is ignored): the coordinator keeps its pending hits that way.
    pub fn encode_with_hits(&self, rank: usize, local: &LocalBits, hits: &[u64]) -> Vec<u64> {
        let flags = LocalBits {
            hits: Vec::new(),
            invalid: local.invalid.clone(),
            ..*local
        };
        let mut words = self.encode(rank, &flags);
        let n = self.cache_words();
        let last_mask = match self.slots % 64 {
            0 => u64::MAX,
            bits => (1u64 << bits) - 1,
        };
        for (w, &word) in hits.iter().take(n).enumerate() {
            let word = if w + 1 == n { word & last_mask } else { word };
            words[w] |= word;
            // The any-hit group is stored inverted (see the module docs).
            words[self.hits_any_start() + w] &= !word;
        }
        words
    }

    /// Reads the AND-reduced `words` (of [`BitLayout::len`] words).
    pub fn decode(&self, words: &[u64]) -> CycleBits {
        let mut words = words.to_vec();
        words.resize(self.len(), 0);
        for word in &mut words[self.or_start()..] {
            *word = !*word;
        }
        let ranks = |start| {
            ones(&words, start, self.size)
                .into_iter()
                .map(|r| r as u32)
                .collect()
        };
        let flags = words[self.flags_start()];
        let hits_all = ones(&words, 0, self.slots);
        CycleBits {
            shutdown_ranks: ranks(self.shutdown_start()),
            joined_ranks: ranks(self.joined_start()),
            any_uncached: flags >> FLAG_UNCACHED & 1 == 1,
            gather_requested: flags >> FLAG_GATHER & 1 == 1,
            cache_capacities_differ: words[self.capacity_and()] != words[self.capacity_or()],
            invalid: ones(&words, self.invalid_start(), self.slots),
            hits_all: hits_all.clone(),
            // Every rank's hit is some rank's: when there are as many of
            // the one as of the other, they are the same (the usual case,
            // without a second pass).
            hits_any: if count_ones(&words, self.hits_any_start(), self.slots) == hits_all.len() {
                hits_all
            } else {
                ones(&words, self.hits_any_start(), self.slots)
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn local(cap: usize) -> impl Strategy<Value = LocalBits> {
        let slots = move || prop::collection::vec(0..cap.max(1), 0..6);
        // Mostly one capacity, as a healthy world has; the largest one
        // takes every bit of its word.
        let capacity = prop_oneof![
            4 => Just(1024usize),
            1 => Just(0usize),
            1 => Just(crate::response_cache::MAX_CAPACITY),
        ];
        (any::<[bool; 4]>(), slots(), slots(), capacity).prop_map(
            move |(f, invalid, hits, cache_capacity)| LocalBits {
                shutdown: f[0],
                joined: f[1],
                uncached: f[2],
                gather: f[3],
                cache_capacity,
                invalid: invalid.into_iter().filter(|&s| s < cap).collect(),
                hits: hits.into_iter().filter(|&s| s < cap).collect(),
            },
        )
    }

    fn sorted<T: Ord + Copy>(items: impl IntoIterator<Item = T>) -> Vec<T> {
        items
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    #[test]
    fn agreed_hits_and_gather_decision() {
        let idle = CycleBits {
            hits_all: vec![1, 3, 5],
            hits_any: vec![1, 2, 3, 5],
            invalid: vec![3],
            ..CycleBits::default()
        };
        assert_eq!(idle.agreed_hits(), vec![1, 5]);
        assert!(idle.needs_gather(2), "invalidated slot 3 moves to rank 0");
        let settled = CycleBits {
            invalid: Vec::new(),
            ..idle.clone()
        };
        assert!(!settled.needs_gather(2));
        let joined = CycleBits {
            joined_ranks: vec![1],
            ..settled.clone()
        };
        assert!(joined.agreed_hits().is_empty());
        assert!(joined.needs_gather(2));
        assert!(!joined.everyone_joined(2));
        let quiet_join = CycleBits {
            joined_ranks: vec![1],
            ..CycleBits::default()
        };
        assert!(!quiet_join.needs_gather(2));
        assert!(quiet_join.needs_gather(1), "the last join ends the round");
    }

    proptest! {
        /// Hits given as a bit set encode exactly as hits given as slots.
        #[test]
        fn hit_words_encode_like_hit_slots((cap, l) in (0usize..200).prop_flat_map(|cap| (Just(cap), local(cap)))) {
            let layout = BitLayout::new(3, cap);
            prop_assert_eq!(layout.len(), 3 * cap.div_ceil(64) + 5);
            let mut words = vec![0u64; cap.div_ceil(64)];
            for &slot in &l.hits {
                words[slot / 64] |= 1 << (slot % 64);
            }
            prop_assert_eq!(layout.encode_with_hits(1, &l, &words), layout.encode(1, &l));
        }

        /// AND-reducing the encodings of every rank decodes to the OR of the
        /// flags, ranks and invalid slots and to the AND (and OR) of the hits.
        #[test]
        fn one_and_answers_and_and_or(
            (size, cap, locals) in (1usize..70, 0usize..130).prop_flat_map(|(size, cap)| {
                (Just(size), Just(cap), prop::collection::vec(local(cap), size))
            })
        ) {
            let layout = BitLayout::new(size, cap);
            let mut reduced = vec![u64::MAX; layout.len()];
            for (rank, l) in locals.iter().enumerate() {
                for (acc, w) in reduced.iter_mut().zip(layout.encode(rank, l)) {
                    *acc &= w;
                }
            }
            let bits = layout.decode(&reduced);
            let ranks = |f: fn(&LocalBits) -> bool| -> Vec<u32> {
                (0..size as u32).filter(|&r| f(&locals[r as usize])).collect()
            };
            prop_assert_eq!(bits.shutdown_ranks, ranks(|l| l.shutdown));
            prop_assert_eq!(bits.joined_ranks, ranks(|l| l.joined));
            prop_assert_eq!(bits.any_uncached, locals.iter().any(|l| l.uncached));
            prop_assert_eq!(bits.gather_requested, locals.iter().any(|l| l.gather));
            let first = locals[0].cache_capacity;
            prop_assert_eq!(bits.cache_capacities_differ, locals.iter().any(|l| l.cache_capacity != first));
            prop_assert_eq!(bits.invalid, sorted(locals.iter().flat_map(|l| l.invalid.iter().copied())));
            prop_assert_eq!(bits.hits_any, sorted(locals.iter().flat_map(|l| l.hits.iter().copied())));
            let all: Vec<usize> = (0..cap).filter(|s| locals.iter().all(|l| l.hits.contains(s))).collect();
            prop_assert_eq!(bits.hits_all, all);
        }
    }
}
