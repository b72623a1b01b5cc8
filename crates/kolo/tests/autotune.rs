//! Autotuning on thread ranks (`Config::autotune`): a training loop whose
//! results stay exact while the fusion threshold and cycle time change
//! under it, every rank settling on the same setting, one that scored no
//! lower than the configured one; and ranks that disagree on the setting
//! failing together, naming it.
//!
//! The workload is a smaller version of `benches/autotune.sh`'s, where
//! kolo's default threshold is poor: fp16 compression of many 1 MiB f32
//! gradients. The default fuses them all into one 16-bit buffer of tens of
//! MiB, which leaves the caches between the cast in, the reduction and the
//! cast out; a few MiB at a time stay in cache (`docs/PERFORMANCE.md` has
//! the measured step times). The test asserts results, never timings: the
//! scores compared are the tuner's own.

use kolo::{AutotunePhase, Candidate, Compression, Config, Error, ReduceOp, ReduceOptions};
use kolo_engine_suite::expect_err;
use std::time::Duration;

/// Gradients per step, and elements (f32) in each.
const TENSORS: usize = 24;
const ELEMENTS: usize = 256 << 10;

/// Steps between the ranks' checks of whether every one has settled, and
/// the most steps the test allows (the tuner settles within 60 windows of
/// 4 steps).
const CHECK_EVERY: usize = 10;
const MAX_STEPS: usize = 400;

fn config() -> Config {
    Config::default().autotune(true)
}

/// The inputs: rank `r`'s element `i` of tensor `t` at `step` is
/// `(r + step + t + i) % 7` (small integers: exact in fp16 and in their
/// sum). Both the inputs and the expected sums repeat every 7 elements,
/// so each tensor's are a slice of one long pattern, at an offset.
struct Pattern {
    /// `j % 7` for `j` in `0..ELEMENTS + 7`.
    input: Vec<f32>,
    /// The sum over the ranks `r` of `(r + j) % 7`, likewise.
    sum: Vec<f32>,
}

impl Pattern {
    fn new(ranks: usize) -> Pattern {
        let j = 0..ELEMENTS + 7;
        Pattern {
            input: j.clone().map(|j| (j % 7) as f32).collect(),
            sum: j
                .map(|j| (0..ranks).map(|r| ((r + j) % 7) as f32).sum())
                .collect(),
        }
    }

    fn input(&self, rank: usize, step: usize, t: usize) -> &[f32] {
        let at = (rank + step + t) % 7;
        &self.input[at..at + ELEMENTS]
    }

    fn sum(&self, step: usize, t: usize) -> &[f32] {
        let at = (step + t) % 7;
        &self.sum[at..at + ELEMENTS]
    }
}

/// One training step: every gradient submitted as its own allreduce in a
/// scope (a backward pass's hooks), compressed to fp16; each result
/// checked against the exact sum.
fn step(
    kolo: &kolo::Kolo,
    pattern: &Pattern,
    grads: &mut [Vec<f32>],
    step: usize,
) -> Result<(), Error> {
    for (t, grad) in grads.iter_mut().enumerate() {
        grad.copy_from_slice(pattern.input(kolo.rank(), step, t));
    }
    let options = ReduceOptions::new(ReduceOp::Sum).compression(Compression::Fp16);
    kolo.scope(|s| {
        let handles = grads
            .iter_mut()
            .enumerate()
            .map(|(t, grad)| s.allreduce_async(&format!("grad/{t}"), &mut grad[..], options))
            .collect::<Result<Vec<_>, Error>>()?;
        handles.into_iter().try_for_each(|h| h.wait())
    })?;
    for (t, grad) in grads.iter().enumerate() {
        let want = pattern.sum(step, t);
        if grad[..] != *want {
            let i = grad.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            panic!(
                "rank {} step {step} grad/{t}[{i}]: {} instead of {}",
                kolo.rank(),
                grad[i],
                want[i]
            );
        }
    }
    Ok(())
}

#[test]
fn tuning_settles_alike_on_every_rank_no_worse_than_the_default_with_exact_results() {
    let configured = Candidate {
        fusion_threshold: Config::default().fusion_threshold,
        cycle_time: Config::default().cycle_time,
    };
    let states = kolo::threads::run(2, config(), |kolo| {
        assert_eq!(kolo.autotune().phase, AutotunePhase::Tuning);
        let pattern = Pattern::new(kolo.size());
        let mut grads = vec![vec![0f32; ELEMENTS]; TENSORS];
        let mut steps = 0;
        loop {
            step(kolo, &pattern, &mut grads, steps)?;
            steps += 1;
            if steps % CHECK_EVERY == 0 {
                // Every rank stops at the same step: once all settled.
                let mut settled = [i32::from(kolo.autotune().phase == AutotunePhase::Settled)];
                kolo.allreduce("settled", &mut settled[..], ReduceOp::Min)?;
                if settled[0] == 1 {
                    break;
                }
            }
            assert!(steps < MAX_STEPS, "not settled after {steps} steps");
        }
        // The settled setting holds: more steps, same setting, exact.
        let settled = kolo.autotune();
        for extra in 0..CHECK_EVERY {
            step(kolo, &pattern, &mut grads, steps + extra)?;
        }
        assert_eq!(kolo.autotune(), settled);
        // The configuration the user gave is not rewritten.
        assert_eq!(kolo.config().fusion_threshold, configured.fusion_threshold);
        Ok(settled)
    })
    .expect("the job runs");
    let rank0 = &states[0];
    for (rank, state) in states.iter().enumerate() {
        assert_eq!(state.phase, AutotunePhase::Settled, "rank {rank}");
        assert_eq!(state.candidate(), rank0.candidate(), "rank {rank}");
        assert_eq!(state.samples, rank0.samples, "rank {rank}");
        assert!(rank == 0 || state.scores.is_empty(), "rank {rank}");
    }
    // Rank 0 measured the configured setting first (each candidate's score
    // relative to it in the same pass), and settled on the best it
    // measured: no lower.
    assert_eq!(rank0.scores[0].candidate, configured, "{rank0:?}");
    let default = rank0.score_of(configured).expect("measured");
    let settled = rank0.score_of(rank0.candidate()).expect("measured");
    assert_eq!(default.relative, 1.0, "{rank0:?}");
    assert!(settled.relative >= default.relative, "{rank0:?}");
    for s in &rank0.scores {
        assert!(s.relative <= settled.relative, "{rank0:?}");
    }
    // Within the bound: 10 candidates, 3 passes of 2 windows.
    assert!(rank0.samples <= 60, "{rank0:?}");
    println!(
        "settled on {} B, {:?} after {} windows: {:.2}x the default ({:.0} against {:.0} MB/s)",
        rank0.fusion_threshold,
        rank0.cycle_time,
        rank0.samples,
        settled.relative,
        settled.bytes_per_second / 1e6,
        default.bytes_per_second / 1e6
    );
}

#[test]
fn without_autotune_the_configured_setting_holds() {
    let cycle = Duration::from_micros(500);
    let states = kolo::threads::run(2, Config::default().cycle_time(cycle), |kolo| {
        let pattern = Pattern::new(kolo.size());
        let mut grads = vec![vec![0f32; ELEMENTS]; 2];
        for s in 0..40 {
            step(kolo, &pattern, &mut grads, s)?;
        }
        Ok(kolo.autotune())
    })
    .expect("the job runs");
    for state in states {
        assert_eq!(state.phase, AutotunePhase::Off);
        assert_eq!(
            (state.fusion_threshold, state.cycle_time, state.samples),
            (Config::default().fusion_threshold, cycle, 0)
        );
        assert!(state.scores.is_empty());
    }
}

/// Ranks that disagree on autotuning fail together, naming the setting
/// and which ranks asked for it, instead of one waiting in a broadcast
/// the other never makes.
#[test]
fn ranks_that_disagree_on_autotune_fail_naming_the_setting() {
    let comms = kolo_threads::communicators(2).expect("communicators");
    let errors: Vec<Error> = std::thread::scope(|s| {
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                s.spawn(move || {
                    let config = Config::default().autotune(rank == 0);
                    let kolo = kolo::Kolo::start(comm, config).expect("start");
                    let mut x = [1i32; 2];
                    expect_err(
                        kolo.allreduce("x", &mut x, ReduceOp::Sum),
                        "settings differ",
                    )
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("no panic"))
            .collect()
    });
    for err in errors {
        match &err {
            Error::Config {
                variable, value, ..
            } => {
                assert_eq!(variable, "KOLO_AUTOTUNE");
                assert!(
                    value.contains("on at ranks [0], off at ranks [1]"),
                    "{value}"
                );
            }
            other => panic!("expected a config error, got {other:?}"),
        }
    }
}
