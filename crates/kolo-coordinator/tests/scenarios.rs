//! Cycle scenarios on threads over the fake controller: the cache fast path,
//! invalidation, join, shutdown, stalls, timeline events and bad messages.

mod common;

use common::{allreduce, config, cycle_until, join, name_of, run_ranks};
use kolo_coordinator::{CoordinatorConfig, CoordinatorError, CycleOutput, NegotiationEvent};
use kolo_protocol::{DataType, ReduceOp, Request, RequestKind, Response, ResponseKind};
use std::time::{Duration, Instant};

fn responses(out: &[CycleOutput]) -> Vec<Response> {
    out.iter()
        .flat_map(|o| o.responses.iter().map(|a| (*a.response).clone()))
        .collect()
}

fn names(out: &[CycleOutput]) -> Vec<String> {
    out.iter()
        .flat_map(|o| o.responses.iter().map(|r| name_of(r).to_owned()))
        .collect()
}

#[test]
fn second_identical_step_settles_on_bits_alone() {
    let results = run_ranks(3, &config(16), |rank, coord, ctrl| {
        let step = || -> Vec<Request> {
            let mut reqs: Vec<Request> = ["a", "b", "c"]
                .iter()
                .map(|n| allreduce(rank, n, 8, ReduceOp::Sum))
                .collect();
            reqs.rotate_left(rank); // a different order on every rank
            reqs
        };
        let first = cycle_until(coord, ctrl, step(), 3, 10);
        let calls_before = (ctrl.bitwise_calls, ctrl.gather_calls);
        let second = cycle_until(coord, ctrl, step(), 3, 10);
        let calls = (
            ctrl.bitwise_calls - calls_before.0,
            ctrl.gather_calls - calls_before.1,
        );
        (first, second, calls)
    });
    for (first, second, calls) in &results {
        assert_eq!(first.len(), 1);
        assert!(first[0].stats.gathered);
        assert_eq!(first[0].stats.cache_hits, 0);
        assert_eq!(second.len(), 1);
        assert!(!second[0].stats.gathered);
        assert_eq!(second[0].stats.cache_hits, 3);
        assert_eq!(*calls, (1, 0), "one bitwise allreduce, no gather");
        // Slots were filled in the first step's response order, and cache
        // hits come in slot order: the very same responses again.
        assert_eq!(names(first), ["c", "a", "b"]); // ready order: rank 2's list
        assert_eq!(second[0].responses, first[0].responses);
    }
    assert_eq!(names(&results[1].0), names(&results[0].0));
}

#[test]
fn new_shape_invalidates_the_cached_name_everywhere() {
    let results = run_ranks(2, &config(16), |rank, coord, ctrl| {
        let mut outs = Vec::new();
        // Cached with 4 elements, then everyone changes to 8, then rank 1
        // alone changes to 9 (a mismatch), then everyone uses 8 again.
        for (len0, len1) in [(4, 4), (8, 8), (8, 8), (8, 9), (8, 8), (8, 8)] {
            let len = if rank == 0 { len0 } else { len1 };
            outs.push(cycle_until(
                coord,
                ctrl,
                vec![allreduce(rank, "w", len, ReduceOp::Sum)],
                1,
                5,
            ));
        }
        outs
    });
    assert_eq!(
        results[0].iter().map(|s| names(s)).collect::<Vec<_>>(),
        results[1].iter().map(|s| names(s)).collect::<Vec<_>>()
    );
    let steps = &results[0];
    let gathered: Vec<bool> = steps.iter().map(|s| s[0].stats.gathered).collect();
    assert_eq!(gathered, [true, true, false, true, true, false]);
    assert_eq!(steps[1][0].responses[0].tensor_sizes, [8]);
    assert_eq!(steps[2][0].responses[0].tensor_sizes, [8]);
    let mismatch = &steps[3][0].responses[0];
    assert!(mismatch.is_error(), "{mismatch:?}");
    assert!(
        mismatch.error_message.contains('w') && mismatch.error_message.contains('9'),
        "{}",
        mismatch.error_message
    );
    assert_eq!(results[1][3][0].responses[0], *mismatch);
}

#[test]
fn join_with_uneven_submissions() {
    // Rank 2 has one batch, ranks 0 and 1 three; then everyone joins; then a
    // new epoch starts with the cache intact.
    let results = run_ranks(3, &config(16), |rank, coord, ctrl| {
        let grad = || allreduce(rank, "grad", 6, ReduceOp::Average);
        let rows = Request::new(
            rank as u32,
            "rows",
            RequestKind::Allgather,
            DataType::F32,
            vec![rank as u64 + 1, 2],
        );
        let bcast = Request {
            root_rank: 2,
            ..Request::new(
                rank as u32,
                "bc",
                RequestKind::Broadcast,
                DataType::F32,
                vec![3],
            )
        };
        let mut outs = vec![cycle_until(coord, ctrl, vec![grad()], 1, 5)];
        if rank == 2 {
            outs.push(cycle_until(coord, ctrl, vec![join(rank, "join")], 1, 5));
            outs.push(cycle_until(coord, ctrl, vec![], 1, 5));
            outs.push(cycle_until(coord, ctrl, vec![], 2, 5));
            outs.push(cycle_until(coord, ctrl, vec![], 1, 5));
        } else {
            outs.push(cycle_until(coord, ctrl, vec![grad()], 1, 5));
            outs.push(cycle_until(coord, ctrl, vec![grad()], 1, 5));
            outs.push(cycle_until(coord, ctrl, vec![rows, bcast], 2, 5));
            outs.push(cycle_until(coord, ctrl, vec![join(rank, "join")], 1, 5));
        }
        let joined_after = coord.joined();
        outs.push(cycle_until(coord, ctrl, vec![grad()], 1, 5));
        (outs, joined_after)
    });
    for (outs, joined_after) in &results {
        assert!(!joined_after);
        let all: Vec<Response> = outs.iter().flat_map(|o| responses(o)).collect();
        let rank0: Vec<Response> = results[0].0.iter().flat_map(|o| responses(o)).collect();
        assert_eq!(all, rank0);
    }
    let steps: Vec<Vec<Response>> = results[0].0.iter().map(|o| responses(o)).collect();
    let first = &steps[0][0];
    assert_eq!((first.reduce_op, first.postscale), (ReduceOp::Average, 1.0));
    // Rank 2 joined: "grad" is ready without it, averaged over ranks 0 and 1.
    for step in &steps[1..3] {
        assert_eq!(step.len(), 1);
        assert_eq!(name_of(&step[0]), "grad");
        assert_eq!((step[0].reduce_op, step[0].postscale), (ReduceOp::Sum, 0.5));
        assert_eq!(step[0].devices.len(), 2);
    }
    // Allgather: rank 2 contributes no rows; broadcast from joined rank 2 fails.
    assert_eq!(steps[3][0].first_dims, [1, 2, 0]);
    let bcast_error = &steps[3][1];
    assert!(bcast_error.is_error() && bcast_error.error_message.contains("root rank 2"));
    assert_eq!(steps[4].len(), 1);
    assert_eq!(steps[4][0].kind, ResponseKind::Op(RequestKind::Join));
    assert_eq!(steps[4][0].tensor_names, ["join"]);
    // New epoch: the entry cached before the join (plain Average) hits again.
    assert!(!results[0].0[5][0].stats.gathered);
    assert_eq!(steps[5].as_slice(), std::slice::from_ref(first));
}

#[test]
fn shutdown_names_the_ranks_that_asked() {
    let results = run_ranks(3, &config(4), |rank, coord, ctrl| {
        coord
            .cycle_requests(ctrl, Vec::new(), rank == 1, Instant::now())
            .map_err(|e| e.to_string())
    });
    for out in results {
        let out = out.unwrap_or_default();
        assert!(out.shutdown);
        assert!(!out.stall_shutdown);
        assert_eq!(out.shutdown_ranks, [1]);
    }
}

fn stall_config(warning: u64, shutdown: u64) -> CoordinatorConfig {
    CoordinatorConfig {
        cache_capacity: 8,
        stall_warning: Some(Duration::from_secs(warning)),
        stall_shutdown: Some(Duration::from_secs(shutdown)),
        events: true,
    }
}

/// Cycles at t0 + start, t0 + start + 1 s, ... until shutdown; returns the
/// outputs and the second of the shutdown.
fn until_shutdown(
    coord: &mut kolo_coordinator::Coordinator,
    ctrl: &mut common::FakeController,
    t0: Instant,
    start: u64,
    mut requests: Vec<Request>,
) -> (Vec<CycleOutput>, u64) {
    let mut outs = Vec::new();
    for s in start..start + 20 {
        let now = t0 + Duration::from_secs(s);
        let out = coord
            .cycle_requests(ctrl, std::mem::take(&mut requests), false, now)
            .unwrap_or_else(|e| panic!("{e}"));
        let stop = out.shutdown;
        outs.push(out);
        if stop {
            return (outs, s);
        }
    }
    (outs, u64::MAX)
}

#[test]
fn stalled_tensor_fails_everywhere_and_shuts_down() {
    let t0 = Instant::now();
    let results = run_ranks(3, &stall_config(1, 5), |rank, coord, ctrl| {
        let x = if rank == 1 {
            vec![]
        } else {
            vec![allreduce(rank, "x", 4, ReduceOp::Sum)]
        };
        until_shutdown(coord, ctrl, t0, 0, x)
    });
    for (outs, at) in &results {
        assert_eq!(*at, 5);
        let last = outs.last().map(|o| o.responses.clone()).unwrap_or_default();
        assert_eq!(last.len(), 1);
        assert!(last[0].is_error());
        assert_eq!(
            last[0].error_message,
            "tensor 'x' stalled for 5.0 s: submitted by ranks [0, 2], missing from ranks [1]"
        );
        assert!(outs
            .last()
            .is_some_and(|o| o.stall_shutdown && o.shutdown_ranks.is_empty()));
        assert!(outs[..outs.len() - 1]
            .iter()
            .all(|o| o.responses.is_empty() && !o.shutdown));
    }
}

#[test]
fn tensor_stuck_on_the_cache_path_is_reported_from_rank_zero() {
    let t0 = Instant::now();
    let results = run_ranks(3, &stall_config(2, 4), |rank, coord, ctrl| {
        let x = || allreduce(rank, "x", 4, ReduceOp::Sum);
        let warm = cycle_until(coord, ctrl, vec![x()], 1, 5);
        let again = if rank == 1 { vec![] } else { vec![x()] };
        (warm, until_shutdown(coord, ctrl, t0, 10, again))
    });
    for (warm, (outs, at)) in &results {
        assert!(warm[0].stats.gathered);
        // Waiting on bits from t=10; moved to rank 0 after 2 s (t=13, with its
        // wait counted from t=10); failed at the 4 s shutdown time.
        assert_eq!(*at, 14);
        assert!(
            !outs[0].stats.gathered,
            "the repeat waits on the cache path"
        );
        let last = outs.last().map(|o| o.responses.clone()).unwrap_or_default();
        assert_eq!(
            last[0].error_message,
            "tensor 'x' stalled for 4.0 s: submitted by ranks [0, 2], missing from ranks [1]"
        );
    }
}

#[test]
fn rank_zero_reports_timeline_events() {
    let results = run_ranks(2, &config(8), |rank, coord, ctrl| {
        let first = cycle_until(
            coord,
            ctrl,
            vec![allreduce(rank, "e", 2, ReduceOp::Sum)],
            1,
            5,
        );
        let second = cycle_until(
            coord,
            ctrl,
            vec![allreduce(rank, "e", 2, ReduceOp::Sum)],
            1,
            5,
        );
        (first, second)
    });
    let start = NegotiationEvent::Start {
        tensor: "e".into(),
        kind: RequestKind::Allreduce,
    };
    let ready = |rank| NegotiationEvent::RankReady {
        tensor: "e".into(),
        rank,
    };
    let end = NegotiationEvent::End { tensor: "e".into() };
    assert_eq!(
        results[0].0[0].events,
        [start.clone(), ready(0), ready(1), end.clone()]
    );
    assert_eq!(results[0].1[0].events, [start, end]);
    assert!(results[1].0[0].events.is_empty() && results[1].1[0].events.is_empty());
}

#[test]
fn undecodable_request_list_fails_every_rank_without_hanging() {
    let results = run_ranks(3, &config(8), |rank, coord, ctrl| {
        ctrl.corrupt_gather = rank == 1;
        coord.cycle_requests(
            ctrl,
            vec![allreduce(rank, "z", 2, ReduceOp::Sum)],
            false,
            Instant::now(),
        )
    });
    assert!(
        matches!(&results[0], Err(CoordinatorError::Decode { rank: 1, .. })),
        "{:?}",
        results[0]
    );
    for other in &results[1..] {
        match other {
            Err(CoordinatorError::Aborted { message }) => {
                assert!(message.contains("rank 1"), "{message}")
            }
            other => panic!("expected an abort, got {other:?}"),
        }
    }
}

#[test]
fn wrong_controller_is_an_error() {
    let results = run_ranks(2, &config(8), |rank, _, ctrl| {
        let mut wrong = kolo_coordinator::Coordinator::new(1 - rank, 2, config(8));
        wrong
            .cycle_requests(ctrl, Vec::new(), false, Instant::now())
            .map(drop)
            .map_err(|e| e.to_string())
    });
    for result in results {
        assert!(result.is_err_and(|e| e.contains("controller of rank")));
    }
}

/// Every rank names the same tensors with ids of its own (ids are
/// rank-local): the responses agree, the repeat hits the cache, each rank
/// gets its own id back with every response, and an id stays registered
/// while a cache slot or a pending request refers to it.
#[test]
fn ranks_choose_their_own_ids() {
    use kolo_coordinator::{Submission, TensorId};
    use kolo_protocol::Params;
    let names = ["w1", "b1", "w2", "b2", "w3"];
    let results = run_ranks(3, &config(4), |rank, coord, ctrl| {
        let id_of = |i: usize| TensorId(((i * 7 + rank * 3) % 11) as u32);
        for (i, name) in names.iter().enumerate() {
            coord.register(id_of(i), name).unwrap();
        }
        assert!(coord.register(id_of(0), "other").is_err());
        let step = |order: Vec<usize>| -> Vec<Submission> {
            order
                .into_iter()
                .map(|i| {
                    let params = Params::new(RequestKind::Allreduce, DataType::F32, [i as u64 + 1]);
                    Submission::new(id_of(i), params)
                })
                .collect()
        };
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.rotate_left(rank);
        let mut steps = Vec::new();
        for _ in 0..3 {
            let mut outs = Vec::new();
            let mut submissions = step(order.clone());
            let mut got = 0;
            while got < names.len() {
                assert!(outs.len() < 20, "rank {rank}: the step did not finish");
                let mut out = coord
                    .cycle(
                        ctrl,
                        std::mem::take(&mut submissions),
                        false,
                        Instant::now(),
                    )
                    .unwrap();
                // Hits come as cache slots, valid until the next cycle.
                for hit in std::mem::take(&mut out.hits) {
                    let response = coord.cache().response(hit.slot).unwrap().clone();
                    out.responses.push(kolo_coordinator::Agreed {
                        response,
                        id: hit.id,
                    });
                }
                got += out.responses.len();
                outs.push(out);
            }
            steps.push(outs);
        }
        for outs in &steps {
            for agreed in outs.iter().flat_map(|o| &o.responses) {
                let i = names.iter().position(|n| *n == name_of(agreed)).unwrap();
                assert_eq!(agreed.id, Some(id_of(i)), "rank {rank} gets its own id");
            }
        }
        // Cached (capacity 4 of 5 tensors): the slot holders stay.
        let kept: Vec<bool> = (0..names.len()).map(|i| !coord.forget(id_of(i))).collect();
        (steps, kept)
    });
    let flat = |steps: &[Vec<CycleOutput>]| -> Vec<Vec<Response>> {
        steps.iter().map(|outs| responses(outs)).collect()
    };
    for (steps, kept) in &results {
        assert_eq!(flat(steps), flat(&results[0].0));
        assert_eq!(kept.iter().filter(|&&k| k).count(), 4, "{kept:?}");
        assert_eq!(kept, &results[0].1, "every rank caches the same names");
        assert!(steps[0][0].stats.gathered);
    }
    // With 5 tensors in 4 slots the LRU evicts as it goes: the repeats
    // still agree on every rank, partly from the cache.
    let hits: usize = results[0].0[2].iter().map(|o| o.stats.cache_hits).sum();
    assert!(hits <= 4);
}

/// A warm step through `cycle_deferring` stops at the agreement with the
/// slots every rank performs, and `finish_cycle` then returns what `cycle`
/// returns for the same step (checked against a twin run that calls
/// `cycle`); a cold step is `Done` at once; the next warm step agrees
/// again (the books were settled).
#[test]
fn deferred_books_match_the_whole_cycle() {
    use kolo_coordinator::{Cycle, Intake, Submission, TensorId};
    // Rank `rank`'s step: three small allreduces.
    let step = |rank: usize| -> Vec<Request> {
        ["x", "y", "z"]
            .iter()
            .map(|n| allreduce(rank, n, 4, ReduceOp::Sum))
            .collect()
    };
    let results = run_ranks(2, &config(16), |rank, coord, ctrl| {
        // A cold step fills the cache (through rank 0).
        let cold = cycle_until(coord, ctrl, step(rank), 3, 10);
        let ids: Vec<_> = ["x", "y", "z"]
            .iter()
            .map(|n| coord.names().id(n).expect("registered by the cold step"))
            .collect();
        let repeat = || {
            ids.iter()
                .map(|&id| Submission::repeat(id))
                .collect::<Vec<_>>()
        };
        // Two steps request by request, then three as one group (the
        // first is remembered, the later ones go in and out as one).
        let group: std::sync::Arc<[TensorId]> = ids.iter().copied().collect();
        let mut deferred = Vec::new();
        for step in 0..5 {
            let intake = match step {
                0 | 1 => Intake::from(repeat()),
                _ => Intake::Group(std::sync::Arc::clone(&group)),
            };
            match coord
                .cycle_deferring(ctrl, intake, false, Instant::now())
                .expect("deferred cycle")
            {
                Cycle::Hits(agreement) => {
                    let slots = agreement.slots().to_vec();
                    let responses: Vec<Response> = slots
                        .iter()
                        .map(|&s| (**coord.cache().response(s).expect("cached")).clone())
                        .collect();
                    let out = coord.finish_cycle(agreement);
                    let hit_slots: Vec<usize> = out.hits.iter().map(|h| h.slot).collect();
                    assert_eq!(hit_slots, slots, "the hits are the agreed slots");
                    assert!(out
                        .hits
                        .iter()
                        .zip(&slots)
                        .all(|(h, &s)| coord.cache().id(s).is_some_and(|id| h.id == Some(id))));
                    deferred.push((slots, responses, out.stats, out.shutdown, coord.pending()));
                }
                Cycle::Done(out) => panic!("a warm step went the whole way: {out:?}"),
            }
        }
        // A new tensor cannot be deferred: it goes to rank 0.
        let new = allreduce(rank, "w", 4, ReduceOp::Sum);
        let id = coord.names().end();
        let id = kolo_coordinator::TensorId(id);
        coord.register(id, "w").expect("a new name");
        let done = matches!(
            coord
                .cycle_deferring(
                    ctrl,
                    vec![Submission::new(id, kolo_protocol::Params::of(&new))],
                    false,
                    Instant::now()
                )
                .expect("cycle"),
            Cycle::Done(_)
        );
        (cold, deferred, done)
    });
    let twins = run_ranks(2, &config(16), |rank, coord, ctrl| {
        let _ = cycle_until(coord, ctrl, step(rank), 3, 10);
        (0..5)
            .map(|_| {
                let out = coord
                    .cycle_requests(ctrl, step(rank), false, Instant::now())
                    .expect("cycle");
                (
                    responses(std::slice::from_ref(&out)),
                    out.stats,
                    out.shutdown,
                    coord.pending(),
                )
            })
            .collect::<Vec<_>>()
    });
    for ((cold, deferred, done), twin) in results.iter().zip(&twins) {
        assert_eq!(responses(cold).len(), 3);
        assert!(*done, "a new tensor's cycle is Done");
        assert_eq!(deferred.len(), 5);
        for (
            (slots, got, stats, shutdown, pending),
            (want, twin_stats, twin_shutdown, twin_pending),
        ) in deferred.iter().zip(twin)
        {
            assert_eq!(slots.len(), 3);
            assert_eq!(got, want, "the same responses as the whole cycle's");
            assert_eq!(stats, twin_stats);
            assert_eq!(shutdown, twin_shutdown);
            assert_eq!(pending, twin_pending);
            assert_eq!(*pending, 0, "every request settled");
            assert!(!stats.gathered);
            assert_eq!(stats.cache_hits, 3);
        }
    }
}
