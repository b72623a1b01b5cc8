//! A caller waiting for its own results runs the engine's cycles on its
//! thread (host engines on a `Send` backend); engines whose backend stays
//! on one thread never do. The engine suite checks the results of every
//! operation either way; these tests check who ran the cycles, and that
//! waiters sharing a rank's engine, quiet or not, all complete.

use kolo::{Config, Kolo, ReduceOp, TensorGroup};
use std::time::Duration;

fn config() -> Config {
    Config::default().cycle_time(Duration::from_micros(500))
}

const STEPS: usize = 30;

/// `STEPS` blocking steps of `group` (16 tensors of 33 elements, sum),
/// each checked exactly; returns the rank's caller cycles.
fn blocking_steps(kolo: &Kolo, group: &TensorGroup) -> Result<u64, kolo::Error> {
    let (rank, size) = (kolo.rank() as i64, kolo.size() as i64);
    let mut grads = vec![vec![0i64; 33]; group.len()];
    for step in 0..STEPS as i64 {
        for (t, g) in grads.iter_mut().enumerate() {
            g.fill(rank * 1000 + step + t as i64);
        }
        let mut bufs: Vec<&mut [i64]> = grads.iter_mut().map(|g| &mut g[..]).collect();
        kolo.allreduce_group(group, &mut bufs, ReduceOp::Sum)?;
        for (t, g) in grads.iter().enumerate() {
            let expected = 1000 * size * (size - 1) / 2 + size * (step + t as i64);
            assert!(g.iter().all(|&x| x == expected), "step {step} tensor {t}");
        }
        let mut one = [rank + step];
        kolo.allreduce("one", &mut one[..], ReduceOp::Max)?;
        assert_eq!(one, [size - 1 + step]);
    }
    Ok(kolo.stats().caller_cycles)
}

fn group() -> TensorGroup {
    TensorGroup::new((0..16).map(|i| format!("grad/{i}"))).unwrap()
}

#[test]
fn blocking_calls_run_cycles_on_the_callers_thread() {
    let group = group();
    for ranks in [1, 2, 3] {
        let cycles =
            kolo::threads::run(ranks, config(), |kolo| blocking_steps(kolo, &group)).unwrap();
        assert!(
            cycles.iter().all(|&c| c > 0),
            "{ranks} ranks: cycles run by the callers {cycles:?}"
        );
    }
}

#[test]
fn an_engine_started_on_its_own_thread_keeps_every_cycle() {
    let group = group();
    let comms = kolo_threads::communicators(2).unwrap();
    let cycles: Vec<u64> = std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let group = &group;
                s.spawn(move || {
                    let kolo =
                        Kolo::start_on_thread(move || Ok(comm), config(), |_, _| {}).unwrap();
                    let cycles = blocking_steps(&kolo, group).unwrap();
                    kolo.shutdown().unwrap();
                    cycles
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(cycles, [0, 0]);
}

/// Three threads per rank share its engine: two wait on blocking calls
/// (quiet submissions, which wake nobody) and one on copying async
/// handles (which wake the background thread). Whoever runs the cycles,
/// everything completes with exact results, in any interleaving.
#[test]
fn threads_of_a_rank_that_wait_together_all_complete() {
    for ranks in [2, 4] {
        kolo::threads::run(ranks, config(), |kolo| {
            let size = kolo.size() as i32;
            let rank = kolo.rank() as i32;
            std::thread::scope(|s| {
                let blocking = |prefix: &'static str| {
                    move || -> Result<(), kolo::Error> {
                        for step in 0..STEPS as i32 {
                            let mut x = vec![rank + step; 257];
                            kolo.allreduce(&format!("{prefix}/{step}"), &mut x[..], ReduceOp::Sum)?;
                            let expected = size * (size - 1) / 2 + size * step;
                            assert!(x.iter().all(|&v| v == expected), "{prefix} {step}");
                        }
                        Ok(())
                    }
                };
                let a = s.spawn(blocking("a"));
                let b = s.spawn(blocking("b"));
                let c = s.spawn(|| -> Result<(), kolo::Error> {
                    for step in 0..STEPS as i32 {
                        let mut x = vec![rank * step; 100];
                        let name = format!("c/{step}");
                        kolo.scope(|s| {
                            s.allreduce_async(&name, &mut x[..], ReduceOp::Max)?.wait()
                        })?;
                        assert!(x.iter().all(|&v| v == (size - 1) * step), "c {step}");
                    }
                    Ok(())
                });
                for waiter in [a, b, c] {
                    waiter.join().unwrap()?;
                }
                Ok(())
            })
        })
        .unwrap();
    }
}

/// A repeated `TensorGroup` of 1,000 tensors runs as one collective over
/// the lent memory in every step after the first (the fast path), on
/// every rank.
#[test]
fn a_repeated_large_group_runs_whole() {
    let results = kolo::threads::run(2, kolo::Config::default(), |kolo| {
        let group = kolo::TensorGroup::new((0..1000).map(|t| format!("t{t}")))?;
        let mut bufs = vec![vec![1.0f32; 1024]; 1000];
        let mut whole = Vec::new();
        for _ in 0..6 {
            let before = kolo.stats().whole_operations;
            let mut slices: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            kolo.allreduce_group(&group, &mut slices, kolo::ReduceOp::Max)?;
            whole.push(kolo.stats().whole_operations - before);
        }
        Ok(whole)
    })
    .unwrap();
    for whole in results {
        assert_eq!(whole[1..], [1; 5], "{whole:?}");
    }
}
