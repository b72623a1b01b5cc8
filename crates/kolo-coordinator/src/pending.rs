//! One rank's requests in flight: which wait on the response cache's bit
//! path (by slot), which go to rank 0 with the next gather, and this rank's
//! own parameters for every tensor (what it stores with a cache entry).
//!
//! Everything is indexed by [`TensorId`] and by cache slot: taking in a
//! request that hits the cache, settling it once every rank agreed, and
//! revalidating it are array accesses, with no name touched.

use crate::bit_vector::CycleBits;
use crate::names::{Names, TensorId};
use crate::response_cache::{Lookup, ResponseCache};
use kolo_protocol::{Params, Request, RequestKind, Response};

/// One request of this rank for a cycle: the tensor's id (see
/// [`crate::Coordinator::register`]) and what is asked of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Submission {
    /// The tensor.
    pub id: TensorId,
    /// The collective and its parameters.
    pub params: Params,
}

/// A request for rank 0: the tensor and the parameters it is sent with.
#[derive(Clone, Debug, PartialEq)]
struct Outgoing {
    id: TensorId,
    params: Params,
}

/// One rank's requests that have no response yet.
#[derive(Clone, Debug, Default)]
pub struct PendingRequests {
    rank: u32,
    /// This rank's request for each id in flight (join requests excluded).
    in_flight: Vec<Option<Params>>,
    /// Number of `Some` in `in_flight`.
    in_flight_count: usize,
    /// The tensor waiting on each cache slot's bit.
    hits: Vec<Option<TensorId>>,
    /// The slot each id waits on, if it waits on the bit path.
    waiting: Vec<Option<usize>>,
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
}

/// `slots[index]`, grown with `None` as needed.
fn at<T: Clone>(slots: &mut Vec<Option<T>>, index: usize) -> &mut Option<T> {
    if slots.len() <= index {
        slots.resize(index + 1, None);
    }
    &mut slots[index]
}

impl PendingRequests {
    /// Nothing pending for `rank`, with room for the bits of a cache of
    /// `capacity` slots.
    pub fn new(rank: u32, capacity: usize) -> Self {
        PendingRequests {
            rank,
            hits: vec![None; capacity],
            ..Self::default()
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
        self.in_flight.get(id.index()).is_some_and(Option::is_some)
            || self.outbox.iter().any(|o| o.id == id)
    }

    /// Requests for rank 0 are waiting.
    pub fn has_uncached(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// The cache slots this rank has a pending hit for, ascending.
    pub fn hit_slots(&self) -> Vec<usize> {
        if self.hit_count == 0 {
            return Vec::new();
        }
        let mut slots = Vec::with_capacity(self.hit_count);
        slots.extend(
            self.hits
                .iter()
                .enumerate()
                .filter_map(|(slot, id)| id.map(|_| slot)),
        );
        slots
    }

    /// Sends to rank 0 every bit-path request whose slot no longer holds its
    /// tensor with its parameters (evicted or replaced since it was queued).
    pub fn revalidate(&mut self, cache: &ResponseCache) {
        if self.validated == Some(cache.generation()) {
            return;
        }
        self.validated = Some(cache.generation());
        if self.hit_count == 0 {
            return;
        }
        for slot in 0..self.hits.len() {
            let Some(id) = self.hits[slot] else { continue };
            let valid = self
                .in_flight
                .get(id.index())
                .and_then(Option::as_ref)
                .is_some_and(|params| cache.matches(slot, id, params));
            if !valid {
                self.send_to_rank0(id);
            }
        }
    }

    /// Takes this cycle's new requests and returns the slots they
    /// invalidate (cached tensors requested with other parameters). A join
    /// request marks the rank joined and goes to rank 0.
    pub fn intake(
        &mut self,
        submissions: impl IntoIterator<Item = Submission>,
        cache: &ResponseCache,
    ) -> Vec<usize> {
        let mut invalid = Vec::new();
        for Submission { id, params } in submissions {
            if params.kind == RequestKind::Join {
                self.joined = true;
                self.outbox.push(Outgoing { id, params });
                continue;
            }
            if at(&mut self.in_flight, id.index()).is_some() {
                // A tensor twice in flight: both go to rank 0, which fails
                // it.
                self.send_to_rank0(id);
                self.outbox.push(Outgoing { id, params });
                continue;
            }
            match cache.lookup(id, &params) {
                Lookup::Hit(slot) if slot < self.hits.len() && self.hits[slot].is_none() => {
                    self.hits[slot] = Some(id);
                    *at(&mut self.waiting, id.index()) = Some(slot);
                    self.hit_count += 1;
                }
                Lookup::Mismatch(slot) => {
                    invalid.push(slot);
                    self.outbox.push(Outgoing {
                        id,
                        params: params.clone(),
                    });
                }
                _ => self.outbox.push(Outgoing {
                    id,
                    params: params.clone(),
                }),
            }
            self.in_flight[id.index()] = Some(params);
            self.in_flight_count += 1;
        }
        invalid
    }

    /// After the bit allreduce: bit-path requests on invalidated slots, and
    /// all of them while any rank has joined (rank 0 must see who
    /// contributes), go to rank 0.
    pub fn route(&mut self, bits: &CycleBits) {
        if self.hit_count == 0 {
            return;
        }
        if bits.any_joined() {
            for slot in 0..self.hits.len() {
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
        let id = self.hits.get_mut(slot)?.take()?;
        self.hit_count -= 1;
        if let Some(waiting) = self.waiting.get_mut(id.index()) {
            *waiting = None;
        }
        if let Some(params) = self.in_flight.get_mut(id.index()) {
            if params.take().is_some() {
                self.in_flight_count -= 1;
            }
        }
        Some(id)
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
        let mut first = None;
        for name in &response.tensor_names {
            let Some(id) = names.id(name) else { continue };
            if let Some(slot) = self.waiting.get_mut(id.index()).and_then(Option::take) {
                if let Some(hit) = self.hits.get_mut(slot) {
                    if hit.take().is_some() {
                        self.hit_count -= 1;
                    }
                }
            }
            let params = match self.in_flight.get_mut(id.index()) {
                Some(params) => {
                    let taken = params.take();
                    if taken.is_some() {
                        self.in_flight_count -= 1;
                    }
                    taken
                }
                None => None,
            };
            if first.is_none() && params.is_some() {
                first = Some((id, params));
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
        let Some(slot) = self.waiting.get_mut(id.index()).and_then(Option::take) else {
            return;
        };
        if let Some(hit) = self.hits.get_mut(slot) {
            if hit.take().is_some() {
                self.hit_count -= 1;
            }
        }
        if let Some(Some(params)) = self.in_flight.get(id.index()) {
            self.outbox.push(Outgoing {
                id,
                params: params.clone(),
            });
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
        Submission {
            id: TensorId(id),
            params: params(len),
        }
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
        let mut p = PendingRequests::new(1, 4);
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
        let mut p = PendingRequests::new(1, 4);
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
        let mut p = PendingRequests::new(1, 4);
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
    fn duplicates_and_joins_go_to_rank_zero() {
        let cache = cache_with(&[0]);
        let mut p = PendingRequests::new(1, 4);
        p.intake(vec![sub(0, 2)], &cache);
        p.intake(
            vec![
                sub(0, 2),
                Submission {
                    id: TensorId(3),
                    params: Params::new(RequestKind::Join, DataType::U8, []),
                },
            ],
            &cache,
        );
        assert!(p.joined());
        assert_eq!(outbox_names(&mut p), ["a", "a", "j"]);
        p.end_join_round();
        assert!(!p.joined());
    }
}
