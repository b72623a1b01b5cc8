//! Random well-nested call sequences, interleaved across tensors, come back
//! from the file balanced, nested and complete.

mod common;

use kolo_timeline::Timeline;
use proptest::prelude::*;

/// One timeline call on a tensor.
#[derive(Clone, Debug)]
enum Call {
    NegotiateStart(&'static str),
    RankReady(u32),
    NegotiateEnd,
    OpStart(&'static str),
    OpEnd(Vec<u64>),
    ActivityStart(&'static str),
    ActivityEnd,
}

const KINDS: [&str; 3] = ["ALLREDUCE", "ALLGATHER", "BROADCAST"];
const ACTIVITIES: [&str; 4] = [
    "QUEUE",
    "MEMCPY_IN_FUSION_BUFFER",
    "ALLREDUCE",
    "MEMCPY_OUT_FUSION_BUFFER",
];

/// Activities nest up to two deep inside an op.
fn activity_tree() -> impl Strategy<Value = Vec<Call>> {
    let leaf = (0..ACTIVITIES.len())
        .prop_map(|a| vec![Call::ActivityStart(ACTIVITIES[a]), Call::ActivityEnd]);
    (0..ACTIVITIES.len(), proptest::collection::vec(leaf, 0..3)).prop_map(|(a, children)| {
        let mut calls = vec![Call::ActivityStart(ACTIVITIES[a])];
        calls.extend(children.into_iter().flatten());
        calls.push(Call::ActivityEnd);
        calls
    })
}

/// A negotiation with its ready ticks, then an op with nested activities.
fn tensor_life() -> impl Strategy<Value = Vec<Call>> {
    (
        0..KINDS.len(),
        proptest::collection::vec(0u32..16, 0..5),
        proptest::collection::vec(activity_tree(), 0..4),
        proptest::collection::vec(0u64..100, 0..4),
    )
        .prop_map(|(kind, ranks, activities, shape)| {
            let mut calls = vec![Call::NegotiateStart(KINDS[kind])];
            calls.extend(ranks.into_iter().map(Call::RankReady));
            calls.push(Call::NegotiateEnd);
            calls.push(Call::OpStart(KINDS[kind]));
            calls.extend(activities.into_iter().flatten());
            calls.push(Call::OpEnd(shape));
            calls
        })
}

fn apply(timeline: &Timeline, tensor: &str, call: &Call) {
    match call {
        Call::NegotiateStart(kind) => timeline.negotiate_start(tensor, kind),
        Call::RankReady(rank) => timeline.negotiate_rank_ready(tensor, *rank),
        Call::NegotiateEnd => timeline.negotiate_end(tensor),
        Call::OpStart(op) => timeline.op_start(tensor, op),
        Call::OpEnd(shape) => timeline.op_end(tensor, "float16", shape),
        Call::ActivityStart(activity) => timeline.activity_start(tensor, activity),
        Call::ActivityEnd => timeline.activity_end(tensor),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn well_nested_sequences_stay_balanced(
        lives in proptest::collection::vec(proptest::collection::vec(tensor_life(), 1..3), 1..5),
        picks in proptest::collection::vec(any::<proptest::sample::Index>(), 0..400),
        cycles in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("timeline.json");
        let timeline = Timeline::create(&path, cycles).expect("create");
        let scripts: Vec<Vec<Call>> = lives.into_iter().map(|life| life.into_iter().flatten().collect()).collect();
        let names: Vec<String> = (0..scripts.len()).map(|t| format!("tensor/{t}")).collect();

        // Interleave the tensors' scripts in a random order.
        let mut next = vec![0usize; scripts.len()];
        let mut picks = picks.into_iter();
        loop {
            let pending: Vec<usize> = (0..scripts.len()).filter(|&t| next[t] < scripts[t].len()).collect();
            if pending.is_empty() {
                break;
            }
            let t = match picks.next() {
                Some(index) => pending[index.index(pending.len())],
                None => pending[0],
            };
            apply(&timeline, &names[t], &scripts[t][next[t]]);
            next[t] += 1;
            timeline.mark_cycle();
        }
        timeline.flush().expect("flush");

        let checked = common::check(&common::read(&path));
        prop_assert!(checked.all_closed(), "open: {:?}", checked.open);
        prop_assert_eq!(checked.rows.len(), scripts.len());
        for (name, script) in names.iter().zip(&scripts) {
            let begins = script.iter().filter(|c| matches!(c, Call::NegotiateStart(_) | Call::OpStart(_) | Call::ActivityStart(_))).count();
            let ticks = script.iter().filter(|c| matches!(c, Call::RankReady(_))).count();
            prop_assert_eq!(checked.spans_of(name).len(), begins);
            let row_ticks = checked.ticks_of(name);
            prop_assert_eq!(row_ticks.len(), ticks);
            prop_assert!(row_ticks.iter().all(|t| t.inside.as_deref().is_some_and(|s| s.starts_with("NEGOTIATE_"))));
            let ops_with_args = checked.spans_of(name).iter().filter(|s| s.parent.is_none() && s.end_args.is_some()).count();
            let ops = script.iter().filter(|c| matches!(c, Call::OpEnd(_))).count();
            prop_assert_eq!(ops_with_args, ops);
        }
        let markers = checked.ticks.iter().filter(|t| t.name == "CYCLE_START").count();
        let calls: usize = scripts.iter().map(Vec::len).sum();
        prop_assert_eq!(markers, if cycles { calls } else { 0 });
    }
}
