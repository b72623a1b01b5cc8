//! Rank 0's decision in a cycle that gathered request lists: count the
//! requests in the message table, validate the tensors that became ready in
//! the order they became ready, fail tensors stalled past the shutdown time,
//! and end a join round. Pure: no clock, no transport.

use crate::join::{adjust_for_join, joined_conflict, JoinBook};
use crate::message_table::{MessageTable, TableError};
use crate::output::NegotiationEvent;
use crate::stall::stalled;
use kolo_protocol::{validate, RequestKind, RequestList, Response};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// The inputs of one negotiation besides rank 0's state.
#[derive(Clone, Copy, Debug)]
pub struct Round<'a> {
    /// Every rank's request list, indexed by rank (the sender: a request's
    /// own `rank` field is overwritten with it).
    pub lists: &'a [RequestList],
    /// The ranks that have joined (this cycle's joined bits), ascending.
    pub joined: &'a [u32],
    /// The cycle's time, for new entries and the stall check.
    pub now: Instant,
    /// Fail tensors that waited this long; `None` = never.
    pub stall_shutdown: Option<Duration>,
    /// Earlier arrival times for tensors that waited on the cache path
    /// before they came to the table (see [`crate::stall`]).
    pub first_seen: &'a HashMap<String, Instant>,
}

/// What rank 0 broadcasts, and its timeline events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Responses in the order the tensors became ready, then stall errors,
    /// then the join response.
    pub responses: Vec<Response>,
    /// Tensors stalled past the shutdown time: every rank must stop.
    pub shutdown: bool,
    /// Start / RankReady / End events for the timeline.
    pub events: Vec<NegotiationEvent>,
}

/// Rank 0's negotiation state: the message table and the join round.
#[derive(Clone, Debug)]
pub struct Negotiator {
    table: MessageTable,
    joins: JoinBook,
}

impl Negotiator {
    /// Empty state for a world of `size` ranks.
    pub fn new(size: usize) -> Self {
        Negotiator {
            table: MessageTable::new(size),
            joins: JoinBook::new(),
        }
    }

    /// The pending tensors.
    pub fn table(&self) -> &MessageTable {
        &self.table
    }

    /// Runs one negotiation over the gathered lists.
    pub fn negotiate(&mut self, round: Round<'_>) -> Decision {
        let size = self.table.size();
        let mut decision = Decision::default();
        let mut ready: Vec<String> = Vec::new();
        let mut queued: HashSet<String> = HashSet::new();
        let mut enqueue = |name: String, ready: &mut Vec<String>| {
            if queued.insert(name.clone()) {
                ready.push(name);
            }
        };
        // Tensors that were waiting only for ranks that have joined since.
        for name in self.table.ready(round.joined) {
            enqueue(name, &mut ready);
        }
        for (sender, list) in round.lists.iter().enumerate().take(size) {
            for request in &list.requests {
                let mut request = request.clone();
                request.rank = sender as u32;
                if request.kind == RequestKind::Join {
                    self.joins.record(request.rank, &request.tensor_name);
                    continue;
                }
                let name = request.tensor_name.clone();
                let kind = request.kind;
                let first_seen = round
                    .first_seen
                    .get(&name)
                    .map_or(round.now, |&t| t.min(round.now));
                match self.table.insert(request, first_seen) {
                    Ok(inserted) => {
                        if inserted.new_entry {
                            decision.events.push(NegotiationEvent::Start {
                                tensor: name.clone(),
                                kind,
                            });
                        }
                        decision.events.push(NegotiationEvent::RankReady {
                            tensor: name.clone(),
                            rank: sender as u32,
                        });
                        if self
                            .table
                            .get(&name)
                            .is_some_and(|e| e.is_ready(round.joined))
                        {
                            enqueue(name, &mut ready);
                        }
                    }
                    Err(error) => self.fail(&name, &error, &mut decision),
                }
            }
        }
        for name in ready {
            let Some(entry) = self.table.take(&name) else {
                continue; // failed as a duplicate after it became ready
            };
            let response = match joined_conflict(&entry) {
                None => {
                    let requests: Vec<_> = entry.present().cloned().collect();
                    let mut response = validate(&requests, size as u32);
                    adjust_for_join(&mut response, requests.len(), size);
                    response
                }
                Some(message) => Response::error(name.clone(), message),
            };
            decision.responses.push(response);
            decision.events.push(NegotiationEvent::End { tensor: name });
        }
        if let Some(limit) = round.stall_shutdown {
            for report in stalled(&self.table, round.now, limit, round.joined) {
                self.table.take(&report.tensor);
                decision
                    .responses
                    .push(Response::error(report.tensor.clone(), report.message()));
                decision.events.push(NegotiationEvent::End {
                    tensor: report.tensor,
                });
                decision.shutdown = true;
            }
        }
        if size > 0 && round.joined.len() >= size {
            decision.responses.push(self.joins.response());
            self.joins.reset();
        }
        decision
    }

    /// Fails the tensor of a request that cannot enter the table.
    fn fail(&mut self, name: &str, error: &TableError, decision: &mut Decision) {
        let had_entry = self.table.take(name).is_some();
        decision
            .responses
            .push(Response::error(name, error.to_string()));
        if had_entry {
            decision.events.push(NegotiationEvent::End {
                tensor: name.to_owned(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::{DataType, ReduceOp, Request, ResponseKind};

    fn req(rank: u32, name: &str) -> Request {
        Request {
            reduce_op: ReduceOp::Average,
            ..Request::new(rank, name, RequestKind::Allreduce, DataType::F32, vec![4])
        }
    }

    fn list(requests: Vec<Request>) -> RequestList {
        RequestList {
            requests,
            shutdown: false,
        }
    }

    fn round<'a>(
        lists: &'a [RequestList],
        joined: &'a [u32],
        now: Instant,
        hints: &'a HashMap<String, Instant>,
    ) -> Round<'a> {
        Round {
            lists,
            joined,
            now,
            stall_shutdown: Some(Duration::from_secs(5)),
            first_seen: hints,
        }
    }

    fn names(decision: &Decision) -> Vec<&str> {
        decision
            .responses
            .iter()
            .map(|r| r.tensor_names[0].as_str())
            .collect()
    }

    #[test]
    fn validates_in_the_order_tensors_became_ready() {
        let now = Instant::now();
        let hints = HashMap::new();
        let mut n = Negotiator::new(2);
        // The sender decides the rank, whatever the request says.
        let lists = [
            list(vec![req(7, "a"), req(7, "b")]),
            list(vec![req(0, "b"), req(0, "a")]),
        ];
        let d = n.negotiate(round(&lists, &[], now, &hints));
        assert_eq!(names(&d), ["b", "a"]);
        assert!(d
            .responses
            .iter()
            .all(|r| r.kind == ResponseKind::Op(RequestKind::Allreduce)));
        assert_eq!(d.responses[0].reduce_op, ReduceOp::Average);
        let start = |t: &str| NegotiationEvent::Start {
            tensor: t.into(),
            kind: RequestKind::Allreduce,
        };
        let ready = |t: &str, rank| NegotiationEvent::RankReady {
            tensor: t.into(),
            rank,
        };
        let end = |t: &str| NegotiationEvent::End { tensor: t.into() };
        assert_eq!(
            d.events,
            [
                start("a"),
                ready("a", 0),
                start("b"),
                ready("b", 0),
                ready("b", 1),
                ready("a", 1),
                end("b"),
                end("a")
            ]
        );
        assert!(n.table().is_empty());
    }

    #[test]
    fn a_join_releases_waiting_tensors_averaged_over_contributors() {
        let now = Instant::now();
        let hints = HashMap::new();
        let mut n = Negotiator::new(3);
        let d = n.negotiate(round(
            &[
                list(vec![req(0, "x")]),
                list(vec![req(1, "x")]),
                list(vec![]),
            ],
            &[],
            now,
            &hints,
        ));
        assert!(d.responses.is_empty());
        let join = Request::new(2, "join", RequestKind::Join, DataType::U8, vec![]);
        let lists = [list(vec![req(0, "y")]), list(vec![]), list(vec![join])];
        let d = n.negotiate(round(&lists, &[2], now, &hints));
        assert_eq!(names(&d), ["x"]);
        assert_eq!(
            (d.responses[0].reduce_op, d.responses[0].postscale),
            (ReduceOp::Sum, 0.5)
        );
        // Everyone joins: "y" (only rank 0's) is flushed, then the join ends.
        let joins: Vec<RequestList> = (0..2)
            .map(|r| {
                list(vec![Request::new(
                    r,
                    "join",
                    RequestKind::Join,
                    DataType::U8,
                    vec![],
                )])
            })
            .collect();
        let lists = [joins[0].clone(), joins[1].clone(), list(vec![])];
        let d = n.negotiate(round(&lists, &[0, 1, 2], now, &hints));
        assert_eq!(names(&d), ["y", "join"]);
        // Rank 0 alone contributed: the average is its own value.
        assert_eq!(
            (d.responses[0].reduce_op, d.responses[0].postscale),
            (ReduceOp::Sum, 1.0)
        );
        assert_eq!(d.responses[1].kind, ResponseKind::Op(RequestKind::Join));
        assert!(n.table().is_empty());
    }

    #[test]
    fn duplicates_fail_the_tensor() {
        let now = Instant::now();
        let hints = HashMap::new();
        let mut n = Negotiator::new(2);
        let d = n.negotiate(round(
            &[list(vec![req(0, "d"), req(0, "d")]), list(vec![])],
            &[],
            now,
            &hints,
        ));
        assert_eq!(names(&d), ["d"]);
        assert!(d.responses[0].is_error());
        assert!(d.responses[0]
            .error_message
            .contains("rank 0 submitted tensor 'd' twice"));
        assert!(n.table().is_empty());
    }

    #[test]
    fn stall_shutdown_counts_from_the_earliest_known_arrival() {
        let t0 = Instant::now();
        let mut n = Negotiator::new(2);
        let mut hints = HashMap::new();
        hints.insert("s".to_string(), t0);
        let lists = [list(vec![req(0, "s")]), list(vec![])];
        let d = n.negotiate(round(&lists, &[], t0 + Duration::from_secs(3), &hints));
        assert!(d.responses.is_empty() && !d.shutdown);
        let none = HashMap::new();
        let d = n.negotiate(round(
            &[list(vec![]), list(vec![])],
            &[],
            t0 + Duration::from_secs(5),
            &none,
        ));
        assert!(d.shutdown);
        assert_eq!(
            d.responses[0].error_message,
            "tensor 's' stalled for 5.0 s: submitted by ranks [0], missing from ranks [1]"
        );
        assert_eq!(d.events, [NegotiationEvent::End { tensor: "s".into() }]);
    }
}
