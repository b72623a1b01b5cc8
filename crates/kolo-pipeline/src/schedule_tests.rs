use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Every (minibatch → (sender replica, receiver replica)) pairing seen
/// from the senders' side and from the receivers' side.
fn both_sides(iterations: u64, w_from: usize, w_to: usize) -> [BTreeMap<u64, (usize, usize)>; 2] {
    let mut sent = BTreeMap::new();
    for a in 0..w_from {
        for g in local_minibatches(iterations, Replica::new(a, w_from)) {
            let previous = sent.insert(g, (a, replica_of(g, w_to)));
            assert!(previous.is_none(), "minibatch {g} sent twice");
        }
    }
    let mut received = BTreeMap::new();
    for b in 0..w_to {
        for g in local_minibatches(iterations, Replica::new(b, w_to)) {
            let previous = received.insert(g, (replica_of(g, w_from), b));
            assert!(previous.is_none(), "minibatch {g} received twice");
        }
    }
    [sent, received]
}

proptest! {
    #[test]
    fn every_minibatch_is_sent_and_received_once_by_agreeing_peers(
        w_from in 1usize..7, w_to in 1usize..7, iterations in 0u64..120,
    ) {
        let [sent, received] = both_sides(iterations, w_from, w_to);
        let all: Vec<u64> = (0..iterations).collect();
        prop_assert_eq!(sent.keys().copied().collect::<Vec<_>>(), all.clone());
        prop_assert_eq!(received.keys().copied().collect::<Vec<_>>(), all);
        prop_assert_eq!(&sent, &received);
    }

    #[test]
    fn link_counts_and_sequences_match_what_each_side_sees(
        w_from in 1usize..7, w_to in 1usize..7, iterations in 0u64..120,
    ) {
        let [sent, _] = both_sides(iterations, w_from, w_to);
        for a in 0..w_from {
            let from = Replica::new(a, w_from);
            let mut per_sender = 0;
            for b in 0..w_to {
                let to = Replica::new(b, w_to);
                let expected: Vec<u64> = sent
                    .iter()
                    .filter(|(_, &pair)| pair == (a, b))
                    .map(|(&g, _)| g)
                    .collect();
                let listed: Vec<u64> = link_minibatches(iterations, from, to).collect();
                prop_assert_eq!(&listed, &expected);
                prop_assert_eq!(link_count(iterations, from, to), expected.len() as u64);
                for (n, &g) in expected.iter().enumerate() {
                    prop_assert_eq!(link_nth(from, to, n as u64), Some(g));
                    prop_assert_eq!(link_position(from, to, g), Some(n as u64));
                }
                if !connected(from, to) {
                    prop_assert!(expected.is_empty());
                }
                per_sender += expected.len() as u64;
            }
            prop_assert_eq!(per_sender, local_count(iterations, from));
        }
    }

    #[test]
    fn one_f_one_b_runs_every_pass_once_forward_first(
        stage in 0usize..5, extra in 1usize..4, n in 0usize..20,
    ) {
        let minibatches: Vec<u64> = (0..n as u64).map(|k| 3 * k + 1).collect();
        let passes = one_f_one_b(stage, stage + extra, &minibatches);
        prop_assert_eq!(passes.len(), 2 * n);
        for &g in &minibatches {
            let f = passes.iter().position(|&p| p == Pass::Forward(g));
            let b = passes.iter().position(|&p| p == Pass::Backward(g));
            prop_assert!(matches!((f, b), (Some(f), Some(b)) if f < b));
        }
        // Never more than the warm-up plus one in flight.
        let mut in_flight = 0usize;
        for p in &passes {
            match p {
                Pass::Forward(_) => in_flight += 1,
                Pass::Backward(_) => in_flight -= 1,
            }
            prop_assert!(in_flight <= extra);
        }
    }

    /// With buffered sends, the 1F1B orders of all replicas of a pipeline
    /// of any widths complete: no replica waits forever for a peer.
    #[test]
    fn one_f_one_b_never_deadlocks_over_replicated_stages(
        widths in proptest::collection::vec(1usize..4, 1..5), iterations in 0u64..40,
    ) {
        prop_assert!(simulate(&widths, iterations));
    }
}

/// Runs every replica's 1F1B passes as far as their dependencies allow;
/// true if all complete.
fn simulate(widths: &[usize], iterations: u64) -> bool {
    let stages = widths.len();
    let n = iterations as usize;
    let mut fwd = vec![vec![false; n]; stages];
    let mut bwd = vec![vec![false; n]; stages];
    let mut queues: Vec<(usize, Vec<Pass>, usize)> = Vec::new();
    for (s, &w) in widths.iter().enumerate() {
        for r in 0..w {
            let mine: Vec<u64> = local_minibatches(iterations, Replica::new(r, w)).collect();
            queues.push((s, one_f_one_b(s, stages, &mine), 0));
        }
    }
    loop {
        let mut progress = false;
        for (s, passes, next) in &mut queues {
            let s = *s;
            while let Some(&pass) = passes.get(*next) {
                let ready = match pass {
                    Pass::Forward(g) => s == 0 || fwd[s - 1][g as usize],
                    Pass::Backward(g) => s + 1 == stages || bwd[s + 1][g as usize],
                };
                if !ready {
                    break;
                }
                match pass {
                    Pass::Forward(g) => fwd[s][g as usize] = true,
                    Pass::Backward(g) => bwd[s][g as usize] = true,
                }
                *next += 1;
                progress = true;
            }
        }
        if !progress {
            return queues.iter().all(|(_, passes, next)| *next == passes.len());
        }
    }
}

#[test]
fn widths_one_two_one_deal_alternate_minibatches() {
    let middle: Vec<u64> = local_minibatches(7, Replica::new(1, 2)).collect();
    assert_eq!(middle, [1, 3, 5]);
    // 2 → 3: replica 0 sends 0, 2, 4 to replicas 0, 2, 1 of the next stage.
    let from = Replica::new(0, 2);
    let to: Vec<usize> = local_minibatches(7, from)
        .map(|g| replica_of(g, 3))
        .collect();
    assert_eq!(to, [0, 2, 1, 0]);
    assert_eq!(link_count(7, from, Replica::new(0, 3)), 2);
    // 2 → 4: replica 1 never sends to replicas 0 and 2.
    assert!(!connected(Replica::new(1, 2), Replica::new(0, 4)));
    assert_eq!(link_count(100, Replica::new(1, 2), Replica::new(2, 4)), 0);
}

#[test]
fn one_f_one_b_warms_up_by_the_stages_downstream() {
    use Pass::{Backward as B, Forward as F};
    assert_eq!(
        one_f_one_b(0, 3, &[0, 1, 2, 3]),
        [F(0), F(1), F(2), B(0), F(3), B(1), B(2), B(3)]
    );
    assert_eq!(one_f_one_b(2, 3, &[0, 1]), [F(0), B(0), F(1), B(1)]);
    assert_eq!(one_f_one_b(0, 4, &[5]), [F(5), B(5)]);
    // Replica 0 of a middle stage of width 3 (minibatches 0, 3): minibatch
    // 3 is three global steps ahead, beyond the warm-up of 1.
    assert_eq!(one_f_one_b(1, 3, &[0, 3]), [F(0), B(0), F(3), B(3)]);
}
