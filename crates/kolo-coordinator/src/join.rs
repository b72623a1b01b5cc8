//! Join: ranks with uneven amounts of work.
//!
//! A rank that runs out of work submits a `RequestKind::Join` request and is
//! *joined* from then on. Tensors no longer wait for joined ranks: a tensor is
//! ready once every rank that has not joined submitted it, and every rank,
//! joined ones included, performs its response; a joined rank that lacks the
//! tensor contributes the operation's identity (zeros for a sum, zero rows
//! for an allgather; `kolo_protocol::validate` accepts the absent ranks and
//! lists the devices of the present ones only). A broadcast whose root joined
//! without the tensor and an alltoall that lacks a rank cannot run: see
//! [`joined_conflict`]; they become error responses naming the ranks. An allreduce or reduce-scatter with
//! `ReduceOp::Average` is averaged over the ranks that contributed data:
//! [`adjust_for_join`] turns it into a `Sum` with `postscale / contributors`
//! (the backend's `Average` would divide by the world size).
//!
//! When every rank has joined, one `Op(Join)` response names the join
//! requests (the distinct names, in rank order; normally every rank uses the
//! same name) and carries the last rank to join in `root_rank` (what
//! Horovod's `join` returns; of ranks whose joins reached rank 0 in the
//! same cycle, the highest), and the joined state resets, so the next round
//! starts fresh.

use crate::message_table::TableEntry;
use kolo_protocol::{ReduceOp, RequestKind, Response, ResponseKind};
use std::collections::BTreeMap;

/// Rank 0's record of the join requests of the current round.
#[derive(Clone, Debug, Default)]
pub struct JoinBook {
    names: BTreeMap<u32, String>,
    /// The rank whose join was recorded last.
    last: Option<u32>,
}

impl JoinBook {
    /// An empty round.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `rank`'s join request named `name` (a second one from the
    /// same rank in one round is ignored).
    pub fn record(&mut self, rank: u32, name: &str) {
        if let std::collections::btree_map::Entry::Vacant(slot) = self.names.entry(rank) {
            slot.insert(name.to_owned());
            self.last = Some(rank);
        }
    }

    /// The `Op(Join)` response that ends the round: the distinct join
    /// request names in rank order, and the last rank to join as its
    /// `root_rank`.
    pub fn response(&self) -> Response {
        let mut names: Vec<String> = Vec::new();
        for name in self.names.values() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        let mut response = Response::error(String::new(), String::new());
        response.kind = ResponseKind::Op(RequestKind::Join);
        response.tensor_names = names;
        response.root_rank = self.last.unwrap_or(0);
        response
    }

    /// Starts a new round.
    pub fn reset(&mut self) {
        self.names.clear();
        self.last = None;
    }
}

/// Why a ready `entry` cannot run without the ranks that joined without
/// submitting it (a broadcast whose root is one of them, an alltoall lacking
/// any rank), as the error message naming the ranks; `None` when it can
/// (`kolo_protocol::validate` accepts absent ranks: an allgather gives them
/// zero rows).
pub fn joined_conflict(entry: &TableEntry) -> Option<String> {
    let absent: Vec<u32> = entry.missing(&[]);
    let template = entry.present().next()?;
    if absent.is_empty() {
        return None;
    }
    match template.kind {
        RequestKind::Broadcast if absent.contains(&template.root_rank) => Some(format!(
            "broadcast of tensor '{}' cannot run: its root rank {} has joined without \
             submitting it (joined ranks without the tensor: {:?})",
            entry.name, template.root_rank, absent
        )),
        RequestKind::Alltoall => Some(format!(
            "alltoall of tensor '{}' cannot run while ranks {:?} have joined without \
             submitting it (submitted by ranks {:?})",
            entry.name,
            absent,
            entry.submitted()
        )),
        _ => None,
    }
}

/// Averages over the `contributors` ranks that submitted the tensor when
/// fewer than all `size` did: an `Average` allreduce or reduce-scatter
/// becomes a `Sum` with `postscale / contributors`.
pub fn adjust_for_join(response: &mut Response, contributors: usize, size: usize) {
    let averaging = matches!(
        response.kind,
        ResponseKind::Op(RequestKind::Allreduce | RequestKind::ReduceScatter)
    ) && response.reduce_op == ReduceOp::Average;
    if averaging && contributors > 0 && contributors < size {
        response.reduce_op = ReduceOp::Sum;
        response.postscale /= contributors as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message_table::MessageTable;
    use kolo_protocol::{DataType, Request};
    use std::time::Instant;

    fn entry(size: usize, reqs: Vec<Request>) -> TableEntry {
        let mut table = MessageTable::new(size);
        let name = reqs[0].tensor_name.clone();
        for r in reqs {
            assert!(table.insert(r, Instant::now()).is_ok());
        }
        table
            .take(&name)
            .unwrap_or_else(|| panic!("entry {name} missing"))
    }

    #[test]
    fn broadcast_from_joined_root_and_alltoall_fail_naming_ranks() {
        let bcast = |rank| Request {
            root_rank: 1,
            ..Request::new(rank, "b", RequestKind::Broadcast, DataType::F32, vec![2])
        };
        let err = joined_conflict(&entry(3, vec![bcast(0), bcast(2)])).unwrap_or_default();
        assert!(err.contains("'b'") && err.contains("root rank 1"), "{err}");
        assert_eq!(joined_conflict(&entry(3, vec![bcast(1), bcast(2)])), None);
        let a2a = |rank| Request::new(rank, "a", RequestKind::Alltoall, DataType::F32, vec![3]);
        let err = joined_conflict(&entry(3, vec![a2a(0), a2a(1)])).unwrap_or_default();
        assert!(err.contains("'a'") && err.contains("[2]"), "{err}");
        assert_eq!(joined_conflict(&entry(2, vec![a2a(0), a2a(1)])), None);
        let gather =
            |rank| Request::new(rank, "g", RequestKind::Allgather, DataType::F32, vec![2, 3]);
        assert_eq!(joined_conflict(&entry(3, vec![gather(1)])), None);
    }

    #[test]
    fn the_round_names_the_last_rank_to_join() {
        let mut book = JoinBook::new();
        book.record(2, "join.0");
        book.record(0, "join.0");
        // A second join from a rank already joined changes nothing.
        book.record(2, "join.1");
        let response = book.response();
        assert_eq!(response.kind, ResponseKind::Op(RequestKind::Join));
        assert_eq!(response.tensor_names, ["join.0"]);
        assert_eq!(response.root_rank, 0);
        book.reset();
        book.record(1, "join.1");
        assert_eq!(book.response().root_rank, 1);
    }

    #[test]
    fn average_over_contributors() {
        let mut r = Response::error("x", "");
        r.kind = ResponseKind::Op(RequestKind::Allreduce);
        r.reduce_op = ReduceOp::Average;
        r.postscale = 2.0;
        let mut full = r.clone();
        adjust_for_join(&mut full, 4, 4);
        assert_eq!((full.reduce_op, full.postscale), (ReduceOp::Average, 2.0));
        adjust_for_join(&mut r, 3, 4);
        assert_eq!((r.reduce_op, r.postscale), (ReduceOp::Sum, 2.0 / 3.0));
    }

    #[test]
    fn join_response_names_distinct_requests() {
        let mut book = JoinBook::new();
        book.record(2, "join");
        book.record(0, "join");
        book.record(1, "other");
        book.record(1, "ignored");
        let r = book.response();
        assert_eq!(r.kind, ResponseKind::Op(RequestKind::Join));
        assert_eq!(
            r.tensor_names,
            vec!["join".to_string(), "other".to_string()]
        );
        book.reset();
        assert!(book.response().tensor_names.is_empty());
    }
}
