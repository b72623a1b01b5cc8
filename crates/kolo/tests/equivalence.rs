//! The response cache and tensor fusion change how results are reached,
//! never the results.

mod common;

use common::{config, Rng};
use kolo::{Config, ReduceOp, Stats};

/// A few steps of a gradient-like workload: per step, a group of tensors of
/// different sizes (fused when fusion is on), separate async allreduces and
/// an allgather. Returns every result of every rank, and rank 0's stats.
fn workload(config: Config) -> (Vec<Vec<Vec<f32>>>, Stats) {
    let out = kolo::threads::run(4, config, |kolo| {
        let r = kolo.rank();
        let mut rng = Rng::new(r as u64 + 1);
        let sizes = [1usize, 7, 100, 1000, 33, 4096];
        let mut results = Vec::new();
        for step in 0..6 {
            let mut bufs: Vec<Vec<f32>> = sizes
                .iter()
                .map(|&n| (0..n).map(|_| (rng.below(1000) as f32) - 500.0).collect())
                .collect();
            let names: Vec<String> = (0..sizes.len()).map(|t| format!("grad/{t}")).collect();
            let mut group: Vec<(&str, &mut [f32])> = names
                .iter()
                .map(String::as_str)
                .zip(bufs.iter_mut().map(|b| &mut b[..]))
                .collect();
            kolo.grouped_allreduce(&mut group, ReduceOp::Average)?;

            let mut singles: Vec<Vec<f32>> = (0..4)
                .map(|t| vec![(r * t + step) as f32; 10 + t])
                .collect();
            let handles = singles
                .iter_mut()
                .enumerate()
                .map(|(t, b)| kolo.allreduce_async(&format!("single/{t}"), b, ReduceOp::Sum))
                .collect::<Result<Vec<_>, _>>()?;
            for h in handles {
                h.wait()?;
            }
            let gathered = kolo.allgather("gather", &vec![step as f32; r + 1])?;
            results.extend(bufs);
            results.extend(singles);
            results.push(gathered);
        }
        Ok((results, kolo.stats()))
    })
    .unwrap();
    let stats = out[0].1.clone();
    (out.into_iter().map(|(r, _)| r).collect(), stats)
}

#[test]
fn cache_and_fusion_do_not_change_results() {
    let (reference, base) = workload(config());
    for rank in &reference[1..] {
        assert_eq!(rank, &reference[0], "all ranks agree");
    }
    assert!(
        base.cache_hits > 0,
        "repeated tensors hit the cache: {base:?}"
    );
    assert!(base.fused_operations > 0, "a group fuses: {base:?}");

    let variants = [
        ("no cache", config().cache_capacity(0)),
        ("no fusion", config().fusion_threshold(0)),
        ("neither", config().cache_capacity(0).fusion_threshold(0)),
        ("tiny fusion buffer", config().fusion_threshold(256)),
        ("tiny cache", config().cache_capacity(2)),
    ];
    for (what, variant) in variants {
        let cache_on = variant.cache_capacity > 0;
        let fusion_on = variant.fusion_threshold > 0;
        let (results, stats) = workload(variant);
        // Bitwise equal (f32 compared through its bits).
        let bits = |r: &Vec<Vec<Vec<f32>>>| -> Vec<Vec<Vec<u32>>> {
            r.iter()
                .map(|rank| {
                    rank.iter()
                        .map(|t| t.iter().map(|v| v.to_bits()).collect())
                        .collect()
                })
                .collect()
        };
        assert_eq!(bits(&results), bits(&reference), "{what}");
        if !cache_on {
            assert_eq!(stats.cache_hits, 0, "{what}: {stats:?}");
        }
        if !fusion_on {
            assert_eq!(stats.fused_operations, 0, "{what}: {stats:?}");
            assert_eq!(
                stats.operations, stats.tensors,
                "{what}: one tensor per operation"
            );
        }
    }
}

/// Horovod's fast path: once every tensor of a step is in the response
/// cache, later steps are agreed through the bit-vector allreduce alone —
/// no request list is gathered to rank 0 and no response list broadcast.
#[test]
fn with_a_warm_cache_no_request_list_travels() {
    const TENSORS: usize = 50;
    const STEPS: u64 = 8;
    for ranks in [2, 4] {
        let out = kolo::threads::run(ranks, config(), |kolo| {
            let names: Vec<String> = (0..TENSORS).map(|t| format!("grad/{t}")).collect();
            let mut bufs: Vec<Vec<f32>> = (0..TENSORS).map(|t| vec![1.0; 1 + t * 3]).collect();
            let mut step = |kolo: &kolo::Kolo| {
                let handles = names
                    .iter()
                    .zip(bufs.iter_mut())
                    .map(|(name, buf)| kolo.allreduce_async(name, buf, ReduceOp::Sum))
                    .collect::<Result<Vec<_>, _>>()?;
                handles.into_iter().try_for_each(|h| h.wait())
            };
            // Two cold steps fill the cache on every rank.
            step(kolo)?;
            step(kolo)?;
            let warm = kolo.stats();
            for _ in 0..STEPS {
                step(kolo)?;
            }
            let after = kolo.stats();
            Ok((warm, after, bufs[TENSORS - 1][0]))
        })
        .unwrap();
        for (rank, (warm, after, value)) in out.into_iter().enumerate() {
            assert_eq!(
                after.gathered_cycles, warm.gathered_cycles,
                "{ranks} ranks, rank {rank}: warm steps gathered request lists: {warm:?} -> {after:?}"
            );
            assert_eq!(
                after.cache_hits - warm.cache_hits,
                STEPS * TENSORS as u64,
                "{ranks} ranks, rank {rank}: every warm tensor is a cache hit"
            );
            assert_eq!(value, (ranks as f32).powi(10), "{ranks} ranks, rank {rank}");
        }
    }
}
