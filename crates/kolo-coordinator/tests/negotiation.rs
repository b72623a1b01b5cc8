//! Whole cycles on threads over the fake controller: random submission
//! orders and timings give one response sequence on every rank, and the
//! response cache never changes what is performed.

mod common;

use common::{run_ranks, FakeController};
use kolo_coordinator::Coordinator;
use kolo_protocol::{DataType, ReduceOp, Request, RequestKind, Response};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Instant;

/// When a rank submits each tensor of a step: the order, and the cycle
/// (counted from the step's start) of each position.
#[derive(Clone, Debug)]
struct RankPlan {
    order: Vec<usize>,
    delay: Vec<usize>,
}

impl RankPlan {
    fn at(&self, cycle: usize, chosen: impl Fn(usize) -> bool) -> Vec<usize> {
        self.order
            .iter()
            .zip(&self.delay)
            .filter(|&(&t, &d)| d == cycle && chosen(t))
            .map(|(&t, _)| t)
            .collect()
    }
}

fn rank_plan(n: usize) -> impl Strategy<Value = RankPlan> {
    (
        Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
        prop::collection::vec(0usize..3, n),
    )
        .prop_map(|(order, delay)| RankPlan { order, delay })
}

/// Runs `steps` steps; in each, rank r submits `requests(step, r, t)` for
/// the chosen tensors t by its plan and cycles until `expected(step)`
/// responses arrived. Returns each rank's responses per step.
fn run_steps(
    size: usize,
    capacity: usize,
    plans: &[Vec<RankPlan>],
    chosen: &(dyn Fn(usize, usize) -> bool + Sync),
    request: &(dyn Fn(usize, usize, usize) -> Request + Sync),
) -> Vec<Vec<Vec<Response>>> {
    let config = common::config(capacity);
    run_ranks(
        size,
        &config,
        |rank, coordinator: &mut Coordinator, ctrl: &mut FakeController| {
            let mut per_step = Vec::new();
            for (step, step_plans) in plans.iter().enumerate() {
                let plan = &step_plans[rank];
                let expected = plan.order.iter().filter(|&&t| chosen(step, t)).count();
                let mut responses = Vec::new();
                let mut cycle = 0;
                while responses.len() < expected {
                    assert!(cycle < 50, "rank {rank}: step {step} did not finish");
                    let requests = plan
                        .at(cycle, |t| chosen(step, t))
                        .into_iter()
                        .map(|t| request(step, rank, t))
                        .collect();
                    let out = coordinator
                        .cycle_requests(ctrl, requests, false, Instant::now())
                        .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                    responses.extend(out.responses.iter().map(|a| (*a.response).clone()));
                    cycle += 1;
                }
                per_step.push(responses);
            }
            per_step
        },
    )
}

#[derive(Clone, Debug)]
struct Tensor {
    kind: u8,
    len: u64,
    root: u32,
}

fn tensor_request(size: usize, rank: usize, index: usize, t: &Tensor) -> Request {
    let name = format!("t{index}");
    let rank32 = rank as u32;
    match t.kind {
        0 => Request {
            reduce_op: ReduceOp::Average,
            ..Request::new(
                rank32,
                name,
                RequestKind::Allreduce,
                DataType::F32,
                vec![t.len],
            )
        },
        1 => Request::new(
            rank32,
            name,
            RequestKind::Allgather,
            DataType::F64,
            vec![t.len + rank as u64, 2],
        ),
        _ => Request {
            root_rank: t.root % size as u32,
            ..Request::new(
                rank32,
                name,
                RequestKind::Broadcast,
                DataType::I32,
                vec![t.len],
            )
        },
    }
}

fn workload_a() -> impl Strategy<Value = (usize, usize, Vec<Tensor>, Vec<Vec<RankPlan>>)> {
    let tensor =
        (0u8..3, 1u64..6, 0u32..4).prop_map(|(kind, len, root)| Tensor { kind, len, root });
    (
        2usize..=4,
        prop::collection::vec(tensor, 1..8),
        // A huge capacity allocates nothing by it and behaves as a large one.
        prop::sample::select(vec![0usize, 2, 16, 1_000_000_000]),
    )
        .prop_flat_map(|(size, tensors, capacity)| {
            let n = tensors.len();
            let step = prop::collection::vec(rank_plan(n), size);
            (
                Just(size),
                Just(capacity),
                Just(tensors),
                prop::collection::vec(step, 2),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Ranks submit the same tensors in different orders and cycles, twice:
    /// every rank performs the same responses in the same order, each tensor
    /// exactly once per step, none of them an error.
    #[test]
    fn same_sequence_on_every_rank((size, capacity, tensors, plans) in workload_a()) {
        let results = run_steps(
            size,
            capacity,
            &plans,
            &|_, _| true,
            &|_, rank, t| tensor_request(size, rank, t, &tensors[t]),
        );
        for rank_result in &results[1..] {
            prop_assert_eq!(rank_result, &results[0]);
        }
        for step in &results[0] {
            let mut names: Vec<&str> = step.iter().map(common::name_of).collect();
            names.sort_unstable();
            let mut expected: Vec<String> = (0..tensors.len()).map(|t| format!("t{t}")).collect();
            expected.sort_unstable();
            prop_assert_eq!(names, expected.iter().map(String::as_str).collect::<Vec<_>>());
            prop_assert!(step.iter().all(|r| !r.is_error()), "{:?}", step);
        }
    }
}

/// One step of workload (b): which pool tensors run, each one's shape
/// variant, whether rank 1 disagrees on its shape, and every rank's plan.
#[derive(Clone, Debug)]
struct Step {
    chosen: Vec<bool>,
    variant: Vec<u64>,
    mismatch: Vec<bool>,
    plans: Vec<RankPlan>,
}

const POOL: usize = 5;

fn workload_b() -> impl Strategy<Value = (usize, Vec<Step>)> {
    (2usize..=3).prop_flat_map(|size| {
        let step = (
            prop::collection::vec(any::<bool>(), POOL),
            prop::collection::vec(0u64..2, POOL),
            prop::collection::vec(prop::bool::weighted(0.1), POOL),
            prop::collection::vec(rank_plan(POOL), size),
        )
            .prop_map(|(chosen, variant, mismatch, plans)| Step {
                chosen,
                variant,
                mismatch,
                plans,
            });
        (Just(size), prop::collection::vec(step, 1..7))
    })
}

/// Each step's responses keyed by tensor name (cache hits come after rank
/// 0's responses in slot order, so only the order within a step may differ).
fn by_name(results: &[Vec<Response>]) -> Vec<BTreeMap<String, Response>> {
    results
        .iter()
        .map(|step| {
            step.iter()
                .map(|r| (common::name_of(r).to_owned(), r.clone()))
                .collect()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Multi-step workloads with repeated names, changing shapes, shape
    /// mismatches and a cache too small to hold them all: caches of 0, 2,
    /// 64 and 10^9 slots give the same responses (names and parameters) every step,
    /// and every rank the same sequence.
    #[test]
    fn cache_changes_nothing((size, steps) in workload_b()) {
        let plans: Vec<Vec<RankPlan>> = steps.iter().map(|s| s.plans.clone()).collect();
        let chosen = |step: usize, t: usize| steps[step].chosen[t];
        let request = |step: usize, rank: usize, t: usize| {
            let s = &steps[step];
            let len = 4 + 4 * s.variant[t] + u64::from(s.mismatch[t] && rank == 1);
            common::allreduce(rank, &format!("p{t}"), len, ReduceOp::Sum)
        };
        let reference = run_steps(size, 0, &plans, &chosen, &request);
        for rank_result in &reference[1..] {
            prop_assert_eq!(rank_result, &reference[0]);
        }
        for capacity in [2, 64, 1_000_000_000] {
            let cached = run_steps(size, capacity, &plans, &chosen, &request);
            for rank_result in &cached[1..] {
                prop_assert_eq!(rank_result, &cached[0]);
            }
            prop_assert_eq!(by_name(&cached[0]), by_name(&reference[0]));
        }
    }
}

fn workload_join() -> impl Strategy<Value = (usize, usize, usize, Vec<usize>, Vec<Vec<RankPlan>>)> {
    (
        2usize..=4,
        1usize..4,
        prop::sample::select(vec![0usize, 2, 64, 1_000_000_000]),
    )
        .prop_flat_map(|(size, per_step, capacity)| {
            (
                Just(size),
                Just(per_step),
                Just(capacity),
                prop::collection::vec(0usize..4, size),
                prop::collection::vec(prop::collection::vec(rank_plan(per_step), size), 4),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Ranks run different numbers of steps (averaging the same tensor names
    /// each step) and then join: every rank performs the same sequence, each
    /// step's tensors once, averaged over the ranks that had that step, and
    /// one join response at the end.
    #[test]
    fn join_with_uneven_steps((size, per_step, capacity, steps, plans) in workload_join()) {
        let results = run_ranks(size, &common::config(capacity), |rank, coordinator, ctrl| {
            let mut seen: Vec<Response> = Vec::new();
            let done = |seen: &[Response], step: usize| {
                seen.iter().filter(|r| common::name_of(r).starts_with(&format!("s{step}/"))).count() == per_step
            };
            let mut cycles = 0;
            let mut run = |requests: Vec<Request>, seen: &mut Vec<Response>| {
                assert!(cycles < 100, "rank {rank} did not finish");
                cycles += 1;
                let out = coordinator.cycle_requests(ctrl, requests, false, Instant::now());
                let out = out.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                seen.extend(out.responses.iter().map(|a| (*a.response).clone()));
            };
            for (step, step_plans) in plans.iter().enumerate().take(steps[rank]) {
                let mut cycle = 0;
                while !done(&seen, step) {
                    let requests = step_plans[rank]
                        .at(cycle, |_| true)
                        .into_iter()
                        .map(|t| common::allreduce(rank, &format!("s{step}/{t}"), 3, ReduceOp::Average))
                        .collect();
                    run(requests, &mut seen);
                    cycle += 1;
                }
            }
            let mut requests = vec![common::join(rank, "join")];
            while !seen.iter().any(|r| r.kind == kolo_protocol::ResponseKind::Op(RequestKind::Join)) {
                run(std::mem::take(&mut requests), &mut seen);
            }
            seen
        });
        for rank_result in &results[1..] {
            prop_assert_eq!(rank_result, &results[0]);
        }
        let seen = &results[0];
        let max_steps = steps.iter().copied().max().unwrap_or(0);
        prop_assert_eq!(seen.len(), max_steps * per_step + 1);
        prop_assert_eq!(&seen[seen.len() - 1].tensor_names, &vec!["join".to_string()]);
        for response in &seen[..seen.len() - 1] {
            let name = common::name_of(response);
            let step: usize = name[1..name.find('/').unwrap_or(1)].parse().unwrap_or(usize::MAX);
            let contributors = steps.iter().filter(|&&s| s > step).count();
            prop_assert!(!response.is_error(), "{:?}", response);
            if contributors == size {
                prop_assert_eq!((response.reduce_op, response.postscale), (ReduceOp::Average, 1.0));
            } else {
                prop_assert_eq!((response.reduce_op, response.postscale), (ReduceOp::Sum, 1.0 / contributors as f64));
            }
        }
    }
}
