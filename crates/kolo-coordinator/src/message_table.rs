//! Rank 0's message table: for every tensor some rank asked for and that is
//! not settled yet, the request of each rank that sent one, and when the
//! first one arrived. Entries iterate in the order they were created, which
//! is deterministic given the gathered lists processed in rank order.

use kolo_protocol::{Request, RequestKind};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// Why a request could not enter the table.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// The rank already has a request for this tensor in the table (names
    /// must be unique among a rank's requests in flight).
    #[error("rank {rank} submitted tensor '{tensor}' twice before it was performed")]
    Duplicate {
        /// The tensor's name.
        tensor: String,
        /// The rank that submitted it twice.
        rank: u32,
    },
    /// The request names a rank outside the world.
    #[error("tensor '{tensor}' was submitted by rank {rank}, but the world has {size} ranks")]
    RankOutOfRange {
        /// The tensor's name.
        tensor: String,
        /// The rank the request claims.
        rank: u32,
        /// The number of ranks.
        size: usize,
    },
}

/// One pending tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TableEntry {
    /// The tensor's name.
    pub name: String,
    /// The kind of the first request that arrived.
    pub kind: RequestKind,
    /// The request of each rank, indexed by rank (`None`: not submitted yet).
    pub requests: Vec<Option<Request>>,
    /// When the first request arrived.
    pub first_seen: Instant,
}

impl TableEntry {
    /// Ranks that submitted the tensor, ascending.
    pub fn submitted(&self) -> Vec<u32> {
        self.ranks_where(|r| r.is_some())
    }

    /// Ranks that did not submit it and have not joined, ascending.
    pub fn missing(&self, joined: &[u32]) -> Vec<u32> {
        self.ranks_where(|r| r.is_none())
            .into_iter()
            .filter(|rank| !joined.contains(rank))
            .collect()
    }

    /// True when every rank that has not joined submitted the tensor.
    pub fn is_ready(&self, joined: &[u32]) -> bool {
        self.missing(joined).is_empty()
    }

    /// The submitted requests, in rank order.
    pub fn present(&self) -> impl Iterator<Item = &Request> {
        self.requests.iter().flatten()
    }

    fn ranks_where(&self, keep: impl Fn(&Option<Request>) -> bool) -> Vec<u32> {
        self.requests
            .iter()
            .enumerate()
            .filter(|(_, r)| keep(r))
            .map(|(rank, _)| rank as u32)
            .collect()
    }
}

/// The pending tensors of a world of `size` ranks, in creation order.
#[derive(Clone, Debug)]
pub struct MessageTable {
    size: usize,
    next_seq: u64,
    entries: BTreeMap<u64, TableEntry>,
    index: HashMap<String, u64>,
}

/// What [`MessageTable::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inserted {
    /// The request created the tensor's entry.
    pub new_entry: bool,
}

impl MessageTable {
    /// An empty table for `size` ranks.
    pub fn new(size: usize) -> Self {
        MessageTable {
            size,
            next_seq: 0,
            entries: BTreeMap::new(),
            index: HashMap::new(),
        }
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Number of pending tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no tensor is pending.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records `request` (from rank `request.rank`). A new entry's
    /// `first_seen` is `first_seen`.
    pub fn insert(
        &mut self,
        request: Request,
        first_seen: Instant,
    ) -> Result<Inserted, TableError> {
        let rank = request.rank as usize;
        if rank >= self.size {
            return Err(TableError::RankOutOfRange {
                tensor: request.tensor_name,
                rank: request.rank,
                size: self.size,
            });
        }
        let (seq, new_entry) = match self.index.get(&request.tensor_name) {
            Some(&seq) => (seq, false),
            None => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.index.insert(request.tensor_name.clone(), seq);
                (seq, true)
            }
        };
        let size = self.size;
        let entry = self.entries.entry(seq).or_insert_with(|| TableEntry {
            name: request.tensor_name.clone(),
            kind: request.kind,
            requests: vec![None; size],
            first_seen,
        });
        match &mut entry.requests[rank] {
            Some(_) => Err(TableError::Duplicate {
                tensor: request.tensor_name,
                rank: request.rank,
            }),
            slot => {
                *slot = Some(request);
                Ok(Inserted { new_entry })
            }
        }
    }

    /// The entry for `name`.
    pub fn get(&self, name: &str) -> Option<&TableEntry> {
        self.entries.get(self.index.get(name)?)
    }

    /// Removes and returns the entry for `name`.
    pub fn take(&mut self, name: &str) -> Option<TableEntry> {
        let seq = self.index.remove(name)?;
        self.entries.remove(&seq)
    }

    /// Every entry, in creation order.
    pub fn iter(&self) -> impl Iterator<Item = &TableEntry> {
        self.entries.values()
    }

    /// Names of the entries that every non-joined rank submitted, in
    /// creation order.
    pub fn ready(&self, joined: &[u32]) -> Vec<String> {
        self.iter()
            .filter(|e| e.is_ready(joined))
            .map(|e| e.name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::DataType;
    use proptest::prelude::*;

    fn req(rank: u32, name: &str) -> Request {
        Request::new(rank, name, RequestKind::Allreduce, DataType::F32, vec![4])
    }

    #[test]
    fn counts_ranks_and_readiness() {
        let now = Instant::now();
        let mut table = MessageTable::new(3);
        assert_eq!(
            table.insert(req(1, "a"), now),
            Ok(Inserted { new_entry: true })
        );
        assert_eq!(
            table.insert(req(0, "b"), now),
            Ok(Inserted { new_entry: true })
        );
        assert_eq!(
            table.insert(req(2, "a"), now),
            Ok(Inserted { new_entry: false })
        );
        let a = table.get("a").cloned();
        assert_eq!(a.as_ref().map(TableEntry::submitted), Some(vec![1, 2]));
        assert_eq!(a.as_ref().map(|e| e.missing(&[])), Some(vec![0]));
        assert!(table.ready(&[]).is_empty());
        // Rank 0 joining makes "a" ready, not "b".
        assert_eq!(table.ready(&[0]), vec!["a".to_string()]);
        assert_eq!(
            table.insert(req(0, "a"), now),
            Ok(Inserted { new_entry: false })
        );
        assert_eq!(table.ready(&[]), vec!["a".to_string()]);
        assert!(table.take("a").is_some());
        assert_eq!(table.len(), 1);
        assert!(table.get("a").is_none());
    }

    #[test]
    fn duplicates_and_bad_ranks_are_errors() {
        let now = Instant::now();
        let mut table = MessageTable::new(2);
        assert!(table.insert(req(0, "a"), now).is_ok());
        assert_eq!(
            table.insert(req(0, "a"), now),
            Err(TableError::Duplicate {
                tensor: "a".into(),
                rank: 0
            })
        );
        assert_eq!(
            table.insert(req(5, "b"), now),
            Err(TableError::RankOutOfRange {
                tensor: "b".into(),
                rank: 5,
                size: 2
            })
        );
        assert_eq!(table.len(), 1);
    }

    proptest! {
        /// Whatever the interleaving of (rank, tensor) submissions, a tensor
        /// is ready exactly when every rank submitted it, entries iterate in
        /// first-arrival order, and each rank is recorded once per tensor.
        #[test]
        fn ready_iff_all_ranks_submitted(
            size in 1usize..5,
            subs in prop::collection::vec((0u32..5, 0u8..6), 0..60),
        ) {
            let now = Instant::now();
            let mut table = MessageTable::new(size);
            let mut first_order: Vec<String> = Vec::new();
            let mut seen: std::collections::BTreeSet<(String, u32)> = Default::default();
            for (rank, t) in subs {
                let name = format!("t{t}");
                let result = table.insert(req(rank, &name), now);
                if rank as usize >= size {
                    prop_assert!(result.is_err());
                    continue;
                }
                let fresh = seen.insert((name.clone(), rank));
                prop_assert_eq!(result.is_ok(), fresh);
                if !first_order.contains(&name) {
                    first_order.push(name);
                }
            }
            let order: Vec<String> = table.iter().map(|e| e.name.clone()).collect();
            prop_assert_eq!(&order, &first_order);
            let expected: Vec<String> = first_order
                .iter()
                .filter(|n| (0..size as u32).all(|r| seen.contains(&((*n).clone(), r))))
                .cloned()
                .collect();
            prop_assert_eq!(table.ready(&[]), expected);
        }
    }
}
