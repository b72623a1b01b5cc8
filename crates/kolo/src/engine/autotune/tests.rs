//! The tuner, the windows and the broadcast, without an engine: the
//! search settles within its bound, proposes only grid points, finds the
//! best of a noiseless separable score and never settles below the
//! configured setting's score.

use super::search::{median, Candidate, Decision, Grid, Schedule, Tuner};
use super::shell::{decode, encode};
use super::windows::{Windows, MAX_STEP_TENSORS};
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

fn grid_values() -> impl Strategy<Value = (Vec<usize>, Vec<Duration>)> {
    (
        prop::collection::vec(0usize..(256 << 20), 0..7),
        prop::collection::vec((0u64..20_000).prop_map(Duration::from_micros), 0..5),
    )
}

fn start() -> impl Strategy<Value = Candidate> {
    (0usize..(256 << 20), 0u64..20_000).prop_map(|(t, us)| Candidate {
        fusion_threshold: t,
        cycle_time: Duration::from_micros(us),
    })
}

fn schedule() -> impl Strategy<Value = Schedule> {
    (0usize..3, 1usize..5).prop_map(|(warmup, samples)| Schedule { warmup, samples })
}

/// Runs `tuner` to its end on `score` (called with the candidate and the
/// window's index); every candidate it proposes on the way.
fn run(tuner: &mut Tuner, mut score: impl FnMut(Candidate, usize) -> f64) -> Vec<Candidate> {
    let mut proposed = vec![tuner.current()];
    for window in 0..10_000 {
        match tuner.observe(score(tuner.current(), window)) {
            Decision::Try(next) => proposed.push(next),
            Decision::Settled(done) => {
                proposed.push(done);
                return proposed;
            }
        }
    }
    panic!("no settlement in 10000 windows");
}

/// A noiseless score that is a product of one factor per axis.
fn separable(t: &[u32], c: &[u32], grid: &Grid) -> impl Fn(Candidate) -> f64 {
    let tf: Vec<(usize, f64)> = grid
        .thresholds()
        .iter()
        .zip(t.iter().cycle())
        .map(|(&v, &s)| (v, f64::from(s) + 1.0))
        .collect();
    let cf: Vec<(Duration, f64)> = grid
        .cycle_times()
        .iter()
        .zip(c.iter().cycle())
        .map(|(&v, &s)| (v, f64::from(s) + 1.0))
        .collect();
    move |k: Candidate| {
        let a = tf
            .iter()
            .find(|(v, _)| *v == k.fusion_threshold)
            .map_or(0.0, |x| x.1);
        let b = cf
            .iter()
            .find(|(v, _)| *v == k.cycle_time)
            .map_or(0.0, |x| x.1);
        a * b
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn settles_within_its_bound_and_proposes_only_grid_points(
        (t, c) in grid_values(),
        start in start(),
        schedule in schedule(),
        scores in prop::collection::vec(-1e9f64..1e12, 1..64),
    ) {
        let mut tuner = Tuner::new(Grid::new(t, c, start), start, schedule);
        let bound = tuner.bound();
        prop_assert_eq!(tuner.current(), start);
        let proposed = run(&mut tuner, |_, w| scores[w % scores.len()]);
        prop_assert!(tuner.observed() <= bound, "{} > {}", tuner.observed(), bound);
        for p in &proposed {
            prop_assert!(tuner.grid().contains(*p), "{:?} is not in {:?}", p, tuner.grid());
        }
        let settled = tuner.settled().expect("settled");
        // Settled for good: later windows change nothing.
        prop_assert_eq!(tuner.observe(1e15), Decision::Settled(settled));
        prop_assert_eq!(tuner.observed(), proposed.len() - 1);
    }

    #[test]
    fn a_noiseless_separable_score_settles_on_the_grids_best(
        (t, c) in grid_values(),
        start in start(),
        schedule in schedule(),
        tf in prop::collection::vec(0u32..1000, 1..8),
        cf in prop::collection::vec(0u32..1000, 1..6),
    ) {
        let grid = Grid::new(t, c, start);
        let score = separable(&tf, &cf, &grid);
        let mut tuner = Tuner::new(grid.clone(), start, schedule);
        run(&mut tuner, |k, _| score(k));
        let settled = tuner.settled().expect("settled");
        let best = grid
            .thresholds()
            .iter()
            .flat_map(|&t| grid.cycle_times().iter().map(move |&c| Candidate {
                fusion_threshold: t,
                cycle_time: c,
            }))
            .map(&score)
            .fold(f64::MIN, f64::max);
        prop_assert_eq!(score(settled), best);
    }

    #[test]
    fn any_noiseless_score_settles_on_the_best_measured_never_below_the_start(
        (t, c) in grid_values(),
        start in start(),
        schedule in schedule(),
        seed in any::<u64>(),
    ) {
        // An arbitrary (not separable) function of the candidate.
        let score = |k: Candidate| {
            let x = (k.fusion_threshold as u64) ^ (k.cycle_time.as_nanos() as u64) ^ seed;
            (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f64 + 1.0
        };
        let mut tuner = Tuner::new(Grid::new(t, c, start), start, schedule);
        run(&mut tuner, |k, _| score(k));
        let settled = tuner.settled().expect("settled");
        let measured = tuner.measured();
        prop_assert_eq!(measured[0].candidate, start);
        let top = measured.iter().map(|m| score(m.candidate)).fold(f64::MIN, f64::max);
        prop_assert_eq!(score(settled), top);
        prop_assert!(score(settled) >= score(start));
    }

    #[test]
    fn one_bad_window_per_candidate_does_not_move_the_median(
        (t, c) in grid_values(),
        start in start(),
        tf in prop::collection::vec(0u32..1000, 1..8),
        cf in prop::collection::vec(0u32..1000, 1..6),
        bad in 0usize..3,
    ) {
        let grid = Grid::new(t, c, start);
        let score = separable(&tf, &cf, &grid);
        let schedule = Schedule { warmup: 1, samples: 3 };
        let mut tuner = Tuner::new(grid.clone(), start, schedule);
        // Each candidate's windows alternate discarded and scored; its
        // scored window `bad` is wildly off.
        let mut windows: HashMap<Candidate, usize> = HashMap::new();
        run(&mut tuner, |k, _| {
            let n = windows.entry(k).or_default();
            *n += 1;
            if *n == 2 * bad + 2 { 1e18 } else { score(k) }
        });
        let settled = tuner.settled().expect("settled");
        let mut noiseless = Tuner::new(grid, start, schedule);
        run(&mut noiseless, |k, _| score(k));
        prop_assert_eq!(score(settled), score(noiseless.settled().expect("settled")));
    }

    #[test]
    fn a_load_that_changes_between_passes_changes_nothing(
        (t, c) in grid_values(),
        start in start(),
        tf in prop::collection::vec(0u32..1000, 1..8),
        cf in prop::collection::vec(0u32..1000, 1..6),
        loads in prop::collection::vec(0.1f64..10.0, 1..4),
    ) {
        // A machine whose load is steady within a pass over the
        // candidates but differs from pass to pass (a sequential search
        // would credit it to whichever candidates ran meanwhile): scores
        // relative to the start's in the same pass do not see it.
        let grid = Grid::new(t, c, start);
        let score = separable(&tf, &cf, &grid);
        let mut tuner = Tuner::new(grid.clone(), start, Schedule::default());
        // The pass of each window: the start's scored windows open them.
        let mut pass = 0;
        let mut starts = 0;
        run(&mut tuner, |k, _| {
            if k == start {
                starts += 1;
                if starts % 2 == 1 {
                    pass += 1;
                }
            }
            score(k) * loads[pass % loads.len()]
        });
        let mut noiseless = Tuner::new(grid, start, Schedule::default());
        run(&mut noiseless, |k, _| score(k));
        let (settled, best) = (tuner.settled().expect("settled"), noiseless.settled().expect("settled"));
        prop_assert_eq!(score(settled), score(best));
    }

    #[test]
    fn the_broadcast_round_trips_and_rejects_anything_else(
        start in start(),
        settled in any::<bool>(),
        junk in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let decision = if settled { Decision::Settled(start) } else { Decision::Try(start) };
        prop_assert_eq!(decode(&encode(decision)), Ok(decision));
        // Never a panic; only a message of the right shape reads.
        if let Ok(read) = decode(&junk) {
            prop_assert_eq!(&encode(read)[..], &junk[..]);
        }
    }
}

#[test]
fn kolos_grid_holds_the_configured_setting_and_takes_sixty_windows() {
    let configured = Candidate {
        fusion_threshold: 128 << 20,
        cycle_time: Duration::from_millis(1),
    };
    let grid = Grid::around(configured);
    assert!(grid.contains(configured));
    assert_eq!(
        grid.thresholds(),
        [0, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 128 << 20]
    );
    assert_eq!(grid.cycle_times().len(), 3);
    let mut tuner = Tuner::new(grid, configured, Schedule::default());
    // 6 thresholds, then up to 4 candidates (the start, the best
    // threshold, 2 more cycle times), each 3 times a discarded and a
    // scored window.
    assert_eq!(tuner.bound(), (6 + 4) * 3 * 2);
    let proposed = run(&mut tuner, |_, _| 1.0);
    // Equal scores: the best threshold is the start's, measured once per
    // pass on the second axis.
    assert_eq!(tuner.observed(), (6 + 3) * 3 * 2);
    // Interleaved: the first pass goes over every threshold once, the
    // configured one first.
    let thresholds: Vec<usize> = proposed[..12]
        .iter()
        .step_by(2)
        .map(|c| c.fusion_threshold)
        .collect();
    assert_eq!(
        thresholds,
        [128 << 20, 0, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    );
    // Equal scores: the configured setting wins.
    assert_eq!(tuner.settled(), Some(configured));
}

#[test]
fn a_bad_message_names_what_is_wrong() {
    let good = encode(Decision::Try(Candidate {
        fusion_threshold: 1 << 20,
        cycle_time: Duration::from_millis(1),
    }));
    assert!(decode(&good[..17]).unwrap_err().contains("17 bytes"));
    let mut v = good;
    v[0] = 9;
    assert!(decode(&v).unwrap_err().contains("version 9"));
    let mut f = good;
    f[1] = 2;
    assert!(decode(&f).unwrap_err().contains("settled flag 2"));
    let mut t = good;
    t[2..10].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(decode(&t).unwrap_err().contains("fusion threshold"));
    let mut c = good;
    c[10..18].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(decode(&c).unwrap_err().contains("cycle time"));
}

#[test]
fn windows_end_after_whole_steps_however_a_step_splits_into_cycles() {
    let names = ["a", "b", "c"];
    // One cycle per step: every cycle after the first repeats a name.
    let mut whole = Windows::new(2);
    let ends: Vec<Option<u64>> = (0..5).map(|_| whole.cycle(names, 30)).collect();
    assert_eq!(ends, [None, None, Some(60), None, Some(60)]);
    // One tensor per cycle, idle cycles between: the same windows.
    let mut split = Windows::new(2);
    let mut ends = Vec::new();
    for _ in 0..5 {
        for name in names {
            if let Some(bytes) = split.cycle([name], 10) {
                ends.push(bytes);
            }
            assert_eq!(split.cycle([], 0), None);
        }
    }
    assert_eq!(ends, [60, 60]);
}

#[test]
fn names_that_never_repeat_still_make_windows_of_bounded_steps() {
    let mut windows = Windows::new(1);
    let names: Vec<String> = (0..3 * MAX_STEP_TENSORS)
        .map(|i| format!("op/{i}"))
        .collect();
    let ends: Vec<usize> = names
        .iter()
        .enumerate()
        .filter_map(|(i, name)| windows.cycle([name.as_str()], 1).map(|_| i))
        .collect();
    assert_eq!(ends, [MAX_STEP_TENSORS, 2 * MAX_STEP_TENSORS]);
}

#[test]
fn the_median_is_the_middle_score() {
    assert_eq!(median(&mut []), 0.0);
    assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.0);
}
