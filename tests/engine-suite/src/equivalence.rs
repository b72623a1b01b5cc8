//! The response cache and tensor fusion change how results are reached,
//! never the results.

use crate::{digest, Digest, Rng};
use kolo::{Error, Kolo, ReduceOp, Stats, TensorGroup, TensorMut};

/// The counters that moved between two snapshots.
fn delta(before: &Stats, after: &Stats) -> (u64, u64, u64, u64) {
    (
        after.operations - before.operations,
        after.tensors - before.tensors,
        after.fused_operations - before.fused_operations,
        after.cache_hits - before.cache_hits,
    )
}

/// 48 small f32 tensors of integer values (so sums are exact whatever the
/// order): as one grouped allreduce (fused when fusion is on), then one at
/// a time (never fused). The results are equal and exact.
pub fn fusion_equals_unfused(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    let input = |t: usize| -> Vec<f32> {
        (0..1 + t * 5)
            .map(|i| ((r * 31 + t * 7 + i) % 97) as f32)
            .collect()
    };
    let expected = |t: usize| -> Vec<f32> {
        (0..1 + t * 5)
            .map(|i| (0..n).map(|q| ((q * 31 + t * 7 + i) % 97) as f32).sum())
            .collect()
    };
    let names: Vec<String> = (0..48).map(|t| format!("fuse/{t}")).collect();

    let before = kolo.stats();
    let mut fused: Vec<Vec<f32>> = (0..48).map(input).collect();
    let group = TensorGroup::new(&names)?;
    kolo.scope(|s| {
        let views = fused.iter_mut().map(|b| TensorMut::from(&mut b[..]));
        s.allreduce_group_async(&group, views, ReduceOp::Sum)?
            .wait()
    })?;
    let (ops, tensors, fused_ops, _) = delta(&before, &kolo.stats());
    assert_eq!(tensors, 48);
    if kolo.config().fusion_threshold > 0 {
        assert!(fused_ops > 0 && ops < 48, "{ops} ops, {fused_ops} fused");
    } else {
        assert_eq!((ops, fused_ops), (48, 0));
    }

    let before = kolo.stats();
    let mut single: Vec<Vec<f32>> = (0..48).map(input).collect();
    for (name, buf) in names.iter().zip(single.iter_mut()) {
        kolo.allreduce(name, buf, ReduceOp::Sum)?;
    }
    let (ops, _, fused_ops, _) = delta(&before, &kolo.stats());
    assert_eq!((ops, fused_ops), (48, 0), "one at a time never fuses");

    for (t, (a, b)) in fused.iter().zip(&single).enumerate() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "tensor {t}: fused differs from unfused");
        assert_eq!(a, &expected(t), "tensor {t}");
    }
    Ok(None)
}

/// Six steps of a gradient-like workload: per step a group of tensors of
/// different sizes (fused when fusion is on), separate async allreduces
/// and an allgather, on the same names every step (cache hits when the
/// cache is on). The inputs are small integers, so every result is exact
/// in f32 whatever the order of the sums; the digest of every result lets
/// the runner compare jobs with other settings, bit for bit.
pub fn workload(kolo: &Kolo) -> Result<Digest, Error> {
    let r = kolo.rank();
    let mut rng = Rng::new(r as u64 + 1);
    let sizes = [1usize, 7, 100, 1000, 33, 4096];
    let names: Vec<String> = (0..sizes.len())
        .map(|t| format!("workload/grad/{t}"))
        .collect();
    let before = kolo.stats();
    let mut bits: Vec<u64> = Vec::new();
    for step in 0..6 {
        let mut bufs: Vec<Vec<f32>> = sizes
            .iter()
            .map(|&n| (0..n).map(|_| (rng.below(1000) as f32) - 500.0).collect())
            .collect();
        let mut views: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        kolo.allreduce_group(&TensorGroup::new(&names)?, &mut views, ReduceOp::Average)?;

        let mut singles: Vec<Vec<f32>> = (0..4)
            .map(|t| vec![(r * t + step) as f32; 10 + t])
            .collect();
        let single_names: Vec<String> = (0..4).map(|t| format!("workload/single/{t}")).collect();
        crate::allreduce_each(kolo, &single_names, singles.iter_mut(), ReduceOp::Sum)?;
        let gathered = kolo.allgather("workload/gather", &vec![step as f32; r + 1])?;
        for result in bufs.iter().chain(&singles).chain([&gathered]) {
            bits.extend(result.iter().map(|v| u64::from(v.to_bits())));
        }
    }
    let (ops, tensors, fused_ops, hits) = delta(&before, &kolo.stats());
    let config = kolo.config();
    if config.cache_capacity >= names.len() + 5 {
        assert!(hits > 0, "repeated tensors hit the cache");
    } else if config.cache_capacity == 0 {
        assert_eq!(hits, 0, "no cache, no hits");
    }
    if config.fusion_threshold >= 1 << 20 {
        assert!(fused_ops > 0, "a group fuses: {ops} ops, {fused_ops} fused");
    } else if config.fusion_threshold == 0 {
        assert_eq!(fused_ops, 0, "no fusion");
        assert_eq!(ops, tensors, "one tensor per operation");
    }
    Ok(Some(digest(bits)))
}

/// Horovod's fast path: once every tensor of a step is in the response
/// cache, later steps are agreed through the bit-vector allreduce alone —
/// no request list is gathered to rank 0 and no response list broadcast.
/// (With the cache off, no hits at all.)
pub fn warm_cache_gathers_nothing(kolo: &Kolo) -> Result<Digest, Error> {
    const TENSORS: usize = 50;
    const STEPS: u64 = 8;
    let n = kolo.size() as f32;
    let names: Vec<String> = (0..TENSORS).map(|t| format!("warm/{t}")).collect();
    let mut bufs: Vec<Vec<f32>> = (0..TENSORS).map(|t| vec![1.0; 1 + t * 3]).collect();
    let mut step = || crate::allreduce_each(kolo, &names, bufs.iter_mut(), ReduceOp::Sum);
    // Two cold steps fill the cache on every rank.
    step()?;
    step()?;
    let warm = kolo.stats();
    for _ in 0..STEPS {
        step()?;
    }
    let after = kolo.stats();
    // Every rank's count of gathered cycles during its warm steps. Gathers
    // are collective, so one during the warm steps proper is counted by
    // every rank; but a rank that finishes first may already submit the
    // next case's (uncached) tensors while a slower rank still waits for
    // its last handles, and that rank counts the gather too. The first rank
    // to finish is never disturbed so: the fast path held if some rank
    // counted none.
    let gathered = kolo.allgather(
        "warm/gathered",
        &[(after.gathered_cycles - warm.gathered_cycles) as i64],
    )?;
    let capacity = kolo.config().cache_capacity;
    if capacity >= 4 * TENSORS {
        assert_eq!(
            gathered.iter().min(),
            Some(&0),
            "warm steps gathered request lists on every rank ({gathered:?}): {warm:?} -> {after:?}"
        );
        assert_eq!(
            after.cache_hits - warm.cache_hits,
            STEPS * TENSORS as u64,
            "every warm tensor is a cache hit"
        );
    } else if capacity == 0 {
        assert_eq!(after.cache_hits, warm.cache_hits, "no cache, no hits");
    }
    assert_eq!(bufs[TENSORS - 1][0], n.powi(10));
    Ok(None)
}

/// A training loop's steady state: the same group of tensors every step,
/// submitted as one grouped allreduce of borrowed memory (the engine's
/// repeat path: the step is performed as soon as every rank agrees, the
/// bookkeeping after), except that each rank now and then submits the
/// same tensors one by one or as a [`TensorGroup`] instead, and one step
/// adds a tensor to the group. Every rank's way of submitting meets every
/// other's in the same collective; every step's results are exact.
pub fn repeated_steps_any_submission(kolo: &Kolo) -> Result<Digest, Error> {
    const TENSORS: usize = 12;
    const STEPS: usize = 14;
    let (r, n) = (kolo.rank(), kolo.size());
    let names: Vec<String> = (0..TENSORS).map(|t| format!("repeat/{t}")).collect();
    let sizes: Vec<usize> = (0..TENSORS).map(|t| 1 + (t * 37) % 300).collect();
    let value =
        |step: usize, rank: usize, t: usize, i: usize| ((step + 2 * rank + t + i) % 17) as f32;
    let group = TensorGroup::new(&names)?;
    let mut bits = Vec::new();
    let before = kolo.stats();
    for step in 0..STEPS {
        let mut bufs: Vec<Vec<f32>> = sizes
            .iter()
            .enumerate()
            .map(|(t, &len)| (0..len).map(|i| value(step, r, t, i)).collect())
            .collect();
        let mut extra = vec![r as f32; 5];
        if (step + r) % 4 == 3 {
            crate::allreduce_each(kolo, &names, bufs.iter_mut(), ReduceOp::Sum)?;
            if step == 7 {
                kolo.allreduce("repeat/extra", &mut extra, ReduceOp::Sum)?;
            }
        } else if (step + r) % 4 == 1 {
            let mut views: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            kolo.allreduce_group(&group, &mut views, ReduceOp::Sum)?;
            if step == 7 {
                kolo.allreduce("repeat/extra", &mut extra, ReduceOp::Sum)?;
            }
        } else {
            // A group made for this step (one tensor more in the last).
            let mut step_names: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut views: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            if step == 7 {
                step_names.push("repeat/extra");
                views.push(&mut extra[..]);
            }
            kolo.allreduce_group(&TensorGroup::new(&step_names)?, &mut views, ReduceOp::Sum)?;
        }
        for (t, buf) in bufs.iter().enumerate() {
            for (i, &got) in buf.iter().enumerate() {
                let want: f32 = (0..n).map(|rank| value(step, rank, t, i)).sum();
                assert_eq!(
                    got, want,
                    "step {step}, tensor {t}, element {i} on rank {r}"
                );
            }
            bits.extend(buf.iter().map(|v| u64::from(v.to_bits())));
        }
        if step == 7 {
            let want = (n * (n - 1) / 2) as f32;
            assert_eq!(
                extra,
                vec![want; 5],
                "step {step}: the extra tensor on rank {r}"
            );
        }
    }
    let (_, tensors, _, hits) = delta(&before, &kolo.stats());
    assert_eq!(
        tensors,
        (STEPS * TENSORS + 1) as u64,
        "every tensor performed once a step"
    );
    if kolo.config().cache_capacity >= 4 * TENSORS {
        // Warm steps are agreed by the cache (the extra tensor's one step
        // is not; the first step, and on a slow rank the second, are cold).
        assert!(hits >= ((STEPS - 2) * TENSORS) as u64, "{hits} cache hits");
    }
    Ok(Some(digest(bits)))
}
