//! One rank's requests in flight: which wait on the response cache's bit
//! path, which go to rank 0 with the next gather, and this rank's own
//! request for every tensor (the parameters it stores with a cache entry).

use crate::bit_vector::CycleBits;
use crate::response_cache::{Lookup, ResponseCache};
use kolo_protocol::{Request, RequestKind, Response};
use std::collections::{BTreeMap, HashMap};

/// One rank's requests that have no response yet.
#[derive(Clone, Debug, Default)]
pub struct PendingRequests {
    rank: u32,
    /// Every non-join request submitted and not answered, by name.
    in_flight: HashMap<String, Request>,
    /// Requests waiting on the bit path: name -> cache slot.
    cached: BTreeMap<String, usize>,
    /// Requests for rank 0, sent with the next gather.
    outbox: Vec<Request>,
    /// This rank has joined (until every rank has).
    joined: bool,
    /// The cache generation the bit-path requests were last checked
    /// against (every request entering `cached` is checked on the way in).
    validated: Option<u64>,
}

impl PendingRequests {
    /// Nothing pending for `rank`.
    pub fn new(rank: u32) -> Self {
        PendingRequests {
            rank,
            ..Self::default()
        }
    }

    /// This rank has joined and the round has not ended.
    pub fn joined(&self) -> bool {
        self.joined
    }

    /// Number of requests without a response (join requests excluded).
    pub fn len(&self) -> usize {
        self.in_flight.len()
    }

    /// True when no request waits for a response.
    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    /// Requests for rank 0 are waiting.
    pub fn has_uncached(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// The cache slots this rank has a pending hit for, ascending.
    pub fn hit_slots(&self) -> Vec<usize> {
        let mut slots: Vec<usize> = self.cached.values().copied().collect();
        slots.sort_unstable();
        slots
    }

    /// Sends to rank 0 every bit-path request whose slot no longer holds its
    /// tensor with its parameters (evicted or replaced since it was queued).
    pub fn revalidate(&mut self, cache: &ResponseCache) {
        if self.validated == Some(cache.generation()) {
            return;
        }
        self.validated = Some(cache.generation());
        let stale: Vec<String> = self
            .cached
            .iter()
            .filter(|(name, &slot)| {
                !self
                    .in_flight
                    .get(*name)
                    .is_some_and(|r| cache.matches(slot, r))
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            self.send_to_rank0(&name);
        }
    }

    /// Takes this cycle's new requests (their `rank` set to this rank) and
    /// returns the slots they invalidate (cached names requested with other
    /// parameters). A join request marks the rank joined and goes to rank 0.
    pub fn intake(&mut self, requests: Vec<Request>, cache: &ResponseCache) -> Vec<usize> {
        let mut invalid = Vec::new();
        for mut request in requests {
            request.rank = self.rank;
            if request.kind == RequestKind::Join {
                self.joined = true;
                self.outbox.push(request);
                continue;
            }
            if self.in_flight.contains_key(&request.tensor_name) {
                // A name twice in flight: both go to rank 0, which fails it.
                self.send_to_rank0(&request.tensor_name.clone());
                self.outbox.push(request);
                continue;
            }
            match cache.lookup(&request) {
                Lookup::Hit(slot) => {
                    self.cached.insert(request.tensor_name.clone(), slot);
                }
                Lookup::Mismatch(slot) => {
                    invalid.push(slot);
                    self.outbox.push(request.clone());
                }
                Lookup::Miss => self.outbox.push(request.clone()),
            }
            self.in_flight.insert(request.tensor_name.clone(), request);
        }
        invalid
    }

    /// After the bit allreduce: bit-path requests on invalidated slots, and
    /// all of them while any rank has joined (rank 0 must see who
    /// contributes), go to rank 0; requests on `agreed` slots are settled.
    pub fn route(&mut self, bits: &CycleBits, agreed: &[usize]) {
        let joined_any = !bits.joined_ranks.is_empty();
        let moved: Vec<String> = self
            .cached
            .iter()
            .filter(|(_, slot)| joined_any || bits.invalid.binary_search(slot).is_ok())
            .map(|(name, _)| name.clone())
            .collect();
        for name in moved {
            self.send_to_rank0(&name);
        }
        self.cached
            .retain(|_, slot| agreed.binary_search(slot).is_err());
    }

    /// The requests for rank 0, emptying the outbox.
    pub fn take_outbox(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.outbox)
    }

    /// Settles the tensors named by `response` and returns this rank's
    /// request for each (`None` for names it did not submit).
    pub fn answer(&mut self, response: &Response) -> Vec<Option<Request>> {
        response
            .tensor_names
            .iter()
            .map(|name| {
                self.cached.remove(name);
                self.in_flight.remove(name)
            })
            .collect()
    }

    /// Every rank has joined: the round ends.
    pub fn end_join_round(&mut self) {
        self.joined = false;
    }

    /// Moves a bit-path request to the outbox.
    fn send_to_rank0(&mut self, name: &str) {
        if self.cached.remove(name).is_some() {
            if let Some(request) = self.in_flight.get(name) {
                self.outbox.push(request.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::DataType;

    fn req(name: &str, len: u64) -> Request {
        Request::new(9, name, RequestKind::Allreduce, DataType::F32, vec![len])
    }

    fn cache_with(names: &[&str]) -> ResponseCache {
        let mut cache = ResponseCache::new(4);
        for name in names {
            cache.insert(
                name,
                Response::error(*name, ""),
                Some(Request {
                    rank: 1,
                    ..req(name, 2)
                }),
            );
        }
        cache
    }

    #[test]
    fn hits_wait_misses_and_mismatches_go_to_rank_zero() {
        let cache = cache_with(&["a", "b"]);
        let mut p = PendingRequests::new(1);
        let invalid = p.intake(vec![req("a", 2), req("b", 3), req("c", 2)], &cache);
        assert_eq!(invalid, vec![1]);
        assert_eq!(p.hit_slots(), vec![0]);
        let out: Vec<String> = p.take_outbox().into_iter().map(|r| r.tensor_name).collect();
        assert_eq!(out, vec!["b".to_string(), "c".to_string()]);
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn eviction_and_invalidation_reroute() {
        let mut cache = cache_with(&["a", "b"]);
        let mut p = PendingRequests::new(1);
        p.intake(vec![req("a", 2), req("b", 2)], &cache);
        cache.erase(0);
        p.revalidate(&cache);
        assert_eq!(p.hit_slots(), vec![1]);
        let bits = CycleBits {
            invalid: vec![1],
            ..CycleBits::default()
        };
        p.route(&bits, &[]);
        assert!(p.hit_slots().is_empty());
        assert_eq!(p.take_outbox().len(), 2);
    }

    #[test]
    fn joined_world_sends_everything_and_agreed_settles() {
        let cache = cache_with(&["a", "b"]);
        let mut p = PendingRequests::new(1);
        p.intake(vec![req("a", 2), req("b", 2)], &cache);
        p.route(&CycleBits::default(), &[0]);
        assert_eq!(p.hit_slots(), vec![1]);
        let joined = CycleBits {
            joined_ranks: vec![3],
            ..CycleBits::default()
        };
        p.route(&joined, &[]);
        assert_eq!(p.take_outbox().len(), 1);
        let answered = p.answer(&Response::error("a", ""));
        assert_eq!(answered.len(), 1);
        assert!(answered[0].is_some());
    }

    #[test]
    fn duplicates_and_joins_go_to_rank_zero() {
        let cache = cache_with(&["a"]);
        let mut p = PendingRequests::new(1);
        p.intake(vec![req("a", 2)], &cache);
        p.intake(
            vec![
                req("a", 2),
                Request::new(0, "j", RequestKind::Join, DataType::U8, vec![]),
            ],
            &cache,
        );
        assert!(p.joined());
        assert_eq!(p.take_outbox().len(), 3);
        p.end_join_round();
        assert!(!p.joined());
    }
}
