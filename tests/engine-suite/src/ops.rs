//! Every operation through the engine, with exact (integer) results;
//! random submission orders; handles; several user threads per rank.

use crate::{expect_err, Digest, Rng};
use kolo::{split_rows, Error, Kolo, ReduceOp, ReduceOptions, Tensor, TensorGroup, TensorMut};

/// Allreduce with every reduce op, on integers and floats.
pub fn allreduces(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank() as i64, kolo.size() as i64);
    let mut sum = vec![r + 1; 5];
    kolo.allreduce("sum", &mut sum, ReduceOp::Sum)?;
    assert_eq!(sum, vec![n * (n + 1) / 2; 5]);

    let mut prod = vec![(r + 1) as i32; 3];
    kolo.allreduce("prod", &mut prod, ReduceOp::Product)?;
    assert_eq!(prod, vec![(1..=n as i32).product::<i32>(); 3]);

    let mut min = [r as i16 - 3, 10 - r as i16];
    kolo.allreduce("min", &mut min, ReduceOp::Min)?;
    assert_eq!(min, [-3, 10 - (n as i16 - 1)]);

    let mut max = vec![r as u8; 7];
    kolo.allreduce("max", &mut max, ReduceOp::Max)?;
    assert_eq!(max, vec![n as u8 - 1; 7]);

    // Sum of r * n over r, divided by n: exact.
    let mut avg = vec![r * n; 4];
    kolo.allreduce("avg", &mut avg, ReduceOp::Average)?;
    assert_eq!(avg, vec![n * (n - 1) / 2; 4]);

    // 2-D view, scale factors: 0.5 * sum(2 * (r + 1)) = n (n + 1) / 2.
    let mut m = vec![(r + 1) as f64; 6];
    let options = ReduceOptions::new(ReduceOp::Sum)
        .prescale(2.0)
        .postscale(0.5);
    kolo.allreduce("scaled", TensorMut::with_shape(&mut m, [2, 3]), options)?;
    assert_eq!(m, vec![(n * (n + 1) / 2) as f64; 6]);

    // A tensor above MPI's eager limit (rendezvous protocol).
    let mut big = vec![r as i32 + 1; 1 << 18];
    kolo.allreduce("big", &mut big, ReduceOp::Sum)?;
    assert!(big.iter().all(|&v| v == (n * (n + 1) / 2) as i32));
    Ok(None)
}

/// f16, bf16 (kolo's own MPI datatypes and reductions) and bool.
pub fn half_precision_and_bool(kolo: &Kolo) -> Result<Digest, Error> {
    let n = kolo.size() as f32;
    let mut h = vec![half::f16::from_f32(1.5); 8];
    kolo.allreduce("f16", &mut h, ReduceOp::Sum)?;
    assert!(h.iter().all(|v| v.to_f32() == 1.5 * n), "{h:?}");
    let mut b = vec![half::bf16::from_f32(kolo.rank() as f32); 5];
    kolo.allreduce("bf16", &mut b, ReduceOp::Max)?;
    assert!(b.iter().all(|v| v.to_f32() == n - 1.0), "{b:?}");
    let mut any = [kolo.rank() == 1, false];
    kolo.allreduce("bool", &mut any, ReduceOp::Max)?;
    assert_eq!(any, [n > 1.0, false]);
    Ok(None)
}

/// Allreduces whose f32 and f64 data travel as f16 or bf16: one tensor,
/// a fused group (with an i32 tensor, which travels as it is) and an
/// average, each within the wire type's rounding of the exact result.
pub fn compressed_allreduces(kolo: &Kolo) -> Result<Digest, Error> {
    use kolo::Compression;
    let (r, n) = (kolo.rank(), kolo.size());
    let value = |rank: usize, i: usize| (rank as f64 + 1.0) / 3.0 + i as f64 * 0.01;
    let exact = |i: usize| (0..n).map(|p| value(p, i)).sum::<f64>();
    for (compression, unit) in [
        (Compression::Fp16, 2f64.powi(-11)),
        (Compression::Bf16, 2f64.powi(-8)),
    ] {
        let bound = |i: usize| (n + 2) as f64 * unit * exact(i);
        let sum = ReduceOptions::new(ReduceOp::Sum).compression(compression);
        let mut x: Vec<f32> = (0..300).map(|i| value(r, i) as f32).collect();
        kolo.allreduce(&format!("compressed/{compression}"), &mut x, sum)?;
        for (i, got) in x.iter().enumerate() {
            assert!(
                (f64::from(*got) - exact(i)).abs() <= bound(i),
                "{compression} [{i}]: {got}"
            );
        }
        let group = TensorGroup::new([
            format!("compressed/{compression}/a"),
            format!("compressed/{compression}/b"),
        ])?;
        let mut a: Vec<f64> = (0..40).map(|i| value(r, i)).collect();
        let mut b: Vec<f64> = (0..7).map(|i| value(r, i)).collect();
        kolo.allreduce_group(&group, [&mut a, &mut b], sum)?;
        for (i, got) in a.iter().chain(&b).enumerate() {
            let i = if i < 40 { i } else { i - 40 };
            assert!(
                (got - exact(i)).abs() <= bound(i),
                "{compression} group [{i}]: {got}"
            );
        }
        let mut ints = vec![r as i32 * 1_000_003; 6];
        kolo.allreduce(&format!("compressed/{compression}/ints"), &mut ints, sum)?;
        assert_eq!(ints, vec![(0..n as i32).sum::<i32>() * 1_000_003; 6]);
        let average = ReduceOptions::new(ReduceOp::Average).compression(compression);
        let mut avg: Vec<f32> = (0..9).map(|i| value(r, i) as f32).collect();
        kolo.allreduce(&format!("compressed/{compression}/avg"), &mut avg, average)?;
        for (i, got) in avg.iter().enumerate() {
            let want = exact(i) / n as f64;
            assert!(
                (f64::from(*got) - want).abs() <= bound(i) / n as f64,
                "{compression} avg [{i}]: {got}"
            );
        }
    }
    Ok(None)
}

/// Allgather with a different first dimension on every rank.
pub fn allgathers(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    // Rank r contributes r + 1 rows of 2 columns, valued 100 r + row.
    let local: Vec<i32> = (0..(r + 1) * 2).map(|i| (100 * r + i / 2) as i32).collect();
    let all = kolo.allgather("gather", Tensor::with_shape(&local, [r + 1, 2]))?;
    let expected: Vec<i32> = (0..n)
        .flat_map(|p| (0..(p + 1) * 2).map(move |i| (100 * p + i / 2) as i32))
        .collect();
    assert_eq!(all, expected);

    // A rank with no rows at all.
    let rows = if r == 0 { 0 } else { 1 };
    let few = vec![r as u16; rows];
    let all = kolo.allgather("gather/empty", &few)?;
    assert_eq!(all, (1..n as u16).collect::<Vec<_>>());
    Ok(None)
}

/// Broadcast from the last rank and from rank 0.
pub fn broadcasts(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    let mut buf = vec![r as i64 * 7; 9];
    kolo.broadcast("bcast", &mut buf, n - 1)?;
    assert_eq!(buf, vec![(n as i64 - 1) * 7; 9]);
    let mut flags = [r == 0; 3];
    kolo.broadcast("bcast/bool", &mut flags, 0)?;
    assert_eq!(flags, [true; 3]);
    Ok(None)
}

/// Reduce-scatter of 2n + 1 rows: the first ranks get an extra row.
pub fn reduce_scatters(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    // 2n + 1 rows of 3: the first ranks get an extra row.
    let rows = 2 * n + 1;
    let input: Vec<i32> = (0..rows * 3).map(|i| (i as i32) * 10 + r as i32).collect();
    let split = split_rows(rows, n);
    let start: usize = split[..r].iter().sum();
    let mut shard = vec![0i32; split[r] * 3];
    kolo.reduce_scatter(
        "rs",
        Tensor::with_shape(&input, [rows, 3]),
        &mut shard,
        ReduceOp::Sum,
    )?;
    let rank_sum = (n * (n - 1) / 2) as i32;
    let expected: Vec<i32> = (start * 3..(start + split[r]) * 3)
        .map(|i| i as i32 * 10 * n as i32 + rank_sum)
        .collect();
    assert_eq!(shard, expected);
    Ok(None)
}

/// Alltoall with a different split for every pair of ranks.
pub fn alltoalls(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    // Rank r sends (r + p) % 3 rows of 2 to rank p, valued 1000 r + 10 p + k.
    let splits: Vec<usize> = (0..n).map(|p| (r + p) % 3).collect();
    let send: Vec<i32> = (0..n)
        .flat_map(|p| (0..splits[p] * 2).map(move |k| (1000 * r + 10 * p + k) as i32))
        .collect();
    let rows: usize = splits.iter().sum();
    let got = kolo.alltoall("a2a", Tensor::with_shape(&send, [rows, 2]), &splits)?;
    let expected_splits: Vec<usize> = (0..n).map(|p| (p + r) % 3).collect();
    let expected: Vec<i32> = (0..n)
        .flat_map(|p| (0..expected_splits[p] * 2).map(move |k| (1000 * p + 10 * r + k) as i32))
        .collect();
    assert_eq!(got.splits, expected_splits);
    assert_eq!(got.data, expected);
    Ok(None)
}

/// Releasing the fusion buffers between steps: what the fused operations
/// of a step left is freed (the stats then say none are held), and the
/// steps after it allocate again and compute right. Three gathers
/// submitted together fuse into one buffer on every backend when they
/// reach the same cycle, which some of the steps' are sure to.
pub fn release_buffers(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    let group = TensorGroup::new(["release/a", "release/b"])?;
    let mut freed = 0;
    for step in 0..20 {
        let mut bufs = [vec![r as f32 + 1.0; 1000], vec![1.0; 257]];
        kolo.allreduce_group(&group, bufs.iter_mut(), ReduceOp::Sum)?;
        assert_eq!(bufs[0], vec![(n * (n + 1) / 2) as f32; 1000], "step {step}");
        assert_eq!(bufs[1], vec![n as f32; 257], "step {step}");
        let rows: Vec<Vec<i32>> = (0..3).map(|t| vec![(r * 10 + t) as i32; t + 1]).collect();
        let gathered = kolo.scope(|s| {
            let handles = (0..3)
                .map(|t| s.allgather_async(&format!("release/g{t}"), &rows[t]))
                .collect::<Result<Vec<_>, _>>()?;
            handles
                .into_iter()
                .map(|h| h.wait())
                .collect::<Result<Vec<_>, _>>()
        })?;
        for (t, got) in gathered.iter().enumerate() {
            let expected: Vec<i32> = (0..n)
                .flat_map(|q| vec![(q * 10 + t) as i32; t + 1])
                .collect();
            assert_eq!(got, &expected, "step {step}, gather {t}");
        }
        freed += kolo.release_buffers()?;
        assert_eq!(kolo.stats().fusion_buffer_bytes, 0, "step {step}");
        assert_eq!(kolo.release_buffers()?, 0, "step {step}");
    }
    assert!(n == 1 || freed > 0, "no step left fusion buffers to free");
    Ok(None)
}

/// A group of tensors made for one call, 1-D and shaped, and a barrier.
pub fn group_and_barrier(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank() as i32, kolo.size() as i32);
    let mut a = vec![r; 10];
    let mut b = vec![2 * r; 3];
    let group = TensorGroup::new(["g/a", "g/b"])?;
    kolo.allreduce_group(&group, &mut [&mut a[..], &mut b[..]], ReduceOp::Sum)?;
    assert_eq!(a, vec![n * (n - 1) / 2; 10]);
    assert_eq!(b, vec![n * (n - 1); 3]);
    let mut c = vec![1i64; 6];
    let shaped = TensorGroup::new(["g/c"])?;
    kolo.scope(|s| {
        let views = [TensorMut::with_shape(&mut c[..], [3, 2])];
        s.allreduce_group_async(&shaped, views, ReduceOp::Sum)?
            .wait()
    })?;
    assert_eq!(c, vec![n as i64; 6]);
    kolo.barrier()?;
    kolo.scope(|s| s.barrier_async()?.wait())?;
    Ok(None)
}

/// Several user threads of one rank submitting at once (the engine's
/// background thread makes every backend call).
pub fn several_user_threads(kolo: &Kolo) -> Result<Digest, Error> {
    let n = kolo.size() as i64;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..3)
            .map(|w| {
                s.spawn(move || {
                    for step in 0..4 {
                        let mut x = vec![w as i64 + 1; 64];
                        kolo.allreduce(&format!("w{w}/s{step}"), &mut x, ReduceOp::Sum)?;
                        assert_eq!(x, vec![(w as i64 + 1) * n; 64]);
                    }
                    Ok::<(), Error>(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| match w.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    })?;
    Ok(None)
}

/// Three rounds of 12 allreduces (and 3 allgathers) submitted
/// asynchronously in a different random order on every rank.
pub fn shuffled_submission_orders(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    let mut rng = Rng::new(r as u64 + 17);
    for round in 0..3 {
        let mut order: Vec<usize> = (0..12).collect();
        rng.shuffle(&mut order);
        let mut bufs: Vec<Vec<i64>> = (0..12).map(|t| vec![(r * t) as i64; t + 1]).collect();
        let locals: Vec<Vec<i64>> = (0..12).map(|t| vec![t as i64; r + 1]).collect();
        kolo.scope(|s| {
            let mut gathers = Vec::new();
            let mut reduces = Vec::new();
            for (t, buf) in order.iter().copied().zip(shuffle_refs(&mut bufs, &order)) {
                if t % 4 == 3 {
                    let name = format!("r{round}/g{t}");
                    gathers.push((t, s.allgather_async(&name, &locals[t])?));
                }
                reduces.push(s.allreduce_async(&format!("r{round}/t{t}"), buf, ReduceOp::Sum)?);
            }
            for h in reduces {
                h.wait()?;
            }
            for (t, h) in gathers {
                assert_eq!(h.wait()?, vec![t as i64; n * (n + 1) / 2]);
            }
            Ok::<(), Error>(())
        })?;
        for (t, buf) in bufs.iter().enumerate() {
            assert_eq!(
                buf,
                &vec![(t * n * (n - 1) / 2) as i64; t + 1],
                "round {round} tensor {t}"
            );
        }
    }
    Ok(None)
}

/// Mutable references to `bufs` in the order `order`.
fn shuffle_refs<'a>(bufs: &'a mut [Vec<i64>], order: &[usize]) -> Vec<&'a mut Vec<i64>> {
    let mut slots: Vec<Option<&'a mut Vec<i64>>> = bufs.iter_mut().map(Some).collect();
    order.iter().filter_map(|&t| slots[t].take()).collect()
}

/// A handle polled to completion, awaited, dropped and forgotten.
pub fn handles_wait_poll_and_await(kolo: &Kolo) -> Result<Digest, Error> {
    let n = kolo.size() as i32;
    // poll until done.
    let mut a = vec![1i32; 100];
    kolo.scope(|s| {
        let mut h = s.allreduce_async("poll", &mut a, ReduceOp::Sum)?;
        let result = loop {
            if let Some(result) = h.poll() {
                break result;
            }
            std::thread::yield_now();
        };
        result?;
        assert!(h.is_complete());
        assert!(
            h.poll().is_some_and(|r| r.is_err()),
            "a spent handle says so"
        );
        Ok::<(), Error>(())
    })?;
    assert_eq!(a, vec![n; 100]);

    // .await
    // What a scope's calls read, like what they write, is lent to the
    // scope for its whole life.
    let mut b = vec![2i32; 10];
    let mine = [kolo.rank() as u8];
    let gathered = kolo.scope(|s| {
        futures_executor::block_on(s.allreduce_async("await", &mut b, ReduceOp::Sum)?)?;
        futures_executor::block_on(s.allgather_async("await/g", &mine)?)
    })?;
    assert_eq!(b, vec![2 * n; 10]);
    assert_eq!(gathered, (0..n as u8).collect::<Vec<_>>());

    // Dropped and forgotten handles: the operation still runs, the scope
    // waits for it, and the name is free again afterwards.
    let (mut c, mut c2) = (vec![5i32; 4], vec![6i32; 4]);
    let mut root = vec![kolo.rank() as i32; 3];
    kolo.scope(|s| {
        drop(s.allreduce_async("dropped", &mut c, ReduceOp::Sum)?);
        std::mem::forget(s.allreduce_async("forgotten", &mut c2, ReduceOp::Sum)?);
        drop(s.broadcast_async("dropped/b", &mut root, 0)?);
        Ok::<(), Error>(())
    })?;
    assert_eq!((c, c2), (vec![5 * n; 4], vec![6 * n; 4]));
    let mut d = vec![1i32; 4];
    kolo.allreduce("dropped", &mut d, ReduceOp::Sum)?;
    assert_eq!(d, vec![n; 4]);
    Ok(None)
}

/// Zero-copy allreduces in a `Kolo::scope`: async and group handles,
/// one handle forgotten, mixed with a broadcast; every result is in the
/// caller's buffers once the scope returned.
pub fn scoped_allreduces(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank() as i64, kolo.size() as i64);
    let mut a = vec![r + 1; 1000];
    let mut b = vec![(r + 1) as f32; 3];
    let mut b2 = [r as f32; 4];
    let mut c = vec![r as u8; 17];
    let mut d = vec![r as i32; 1 << 17];
    let mut copied = vec![r as i16; 9];
    let b_group = TensorGroup::new(["scoped/b", "scoped/b2"])?;
    let forgotten = kolo.scope(|s| {
        let copying = s.broadcast_async("scoped/copied", &mut copied, n as usize - 1)?;
        let ha = s.allreduce_async("scoped/a", &mut a, ReduceOp::Sum)?;
        let group = s.allreduce_group_async(
            &b_group,
            [
                TensorMut::from(&mut b[..]),
                TensorMut::with_shape(&mut b2[..], [2, 2]),
            ],
            ReduceOp::Sum,
        );
        let group = group?;
        let hc = s.allreduce_async("scoped/c", &mut c, ReduceOp::Max)?;
        std::mem::forget(s.allreduce_async("scoped/d", &mut d, ReduceOp::Sum)?);
        copying.wait()?;
        group.wait()?;
        hc.wait()?;
        ha.wait()?;
        Ok::<_, Error>(true)
    })?;
    assert!(forgotten);
    assert_eq!(a, vec![n * (n + 1) / 2; 1000]);
    assert_eq!(b, vec![(n * (n + 1) / 2) as f32; 3]);
    assert_eq!(b2, [(n * (n - 1) / 2) as f32; 4]);
    assert_eq!(c, vec![n as u8 - 1; 17]);
    assert!(d.iter().all(|&v| i64::from(v) == n * (n - 1) / 2));
    assert_eq!(copied, vec![n as i16 - 1; 9]);
    Ok(None)
}

/// Allreduces of [`TensorGroup`]s step after step: two groups in flight
/// together in a scope (one with a 2-D view, different element types and
/// reduce ops), then a blocking average; every result exact at every step.
pub fn tensor_groups(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank() as i64, kolo.size() as i64);
    let lens = [1usize, 7, 64, 1000, 3, 4096];
    let names: Vec<String> = (0..lens.len()).map(|t| format!("tg/a{t}")).collect();
    let a_group = TensorGroup::new(&names)?;
    let b_group = TensorGroup::new(["tg/b0", "tg/b1"])?;
    for step in 0..4i64 {
        let mut a: Vec<Vec<i64>> = lens
            .iter()
            .enumerate()
            .map(|(t, &len)| vec![r + t as i64 + step; len])
            .collect();
        let mut b0 = vec![(r + step) as f32; 6];
        let mut b1 = vec![1.0f32; 5];
        kolo.scope(|s| {
            let views = a.iter_mut().map(|v| &mut v[..]);
            let ha = s.allreduce_group_async(&a_group, views, ReduceOp::Sum)?;
            let hb = s.allreduce_group_async(
                &b_group,
                [
                    TensorMut::with_shape(&mut b0[..], [2, 3]),
                    TensorMut::from(&mut b1[..]),
                ],
                ReduceOp::Max,
            )?;
            hb.wait()?;
            ha.wait()
        })?;
        for (t, v) in a.iter().enumerate() {
            let want = n * (n - 1) / 2 + n * (t as i64 + step);
            assert!(
                v.iter().all(|&x| x == want),
                "step {step}: tg/a{t} on rank {r} is not {want}"
            );
        }
        assert_eq!(b0, vec![(n - 1 + step) as f32; 6], "step {step}: tg/b0");
        assert_eq!(b1, vec![1.0; 5], "step {step}: tg/b1");
    }
    let c_group = TensorGroup::new(["tg/c0", "tg/c1", "tg/c2"])?;
    let mut c = vec![vec![(2 * r) as f64; 8]; 3];
    let mut views: Vec<&mut [f64]> = c.iter_mut().map(|v| &mut v[..]).collect();
    kolo.allreduce_group(&c_group, &mut views, ReduceOp::Average)?;
    assert!(c.iter().flatten().all(|&x| x == (n - 1) as f64), "{c:?}");
    Ok(None)
}

/// Groups made per call, whatever the shapes (an empty tensor too),
/// in a scope and blocking; a group with a tensor the ranks disagree on
/// fails naming it, leaving it untouched and delivering the others; a
/// [`TensorGroup`] step after step; a submission of too few buffers
/// refused.
pub fn group_rules(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank() as i64, kolo.size() as i64);
    let (mut a, mut b, mut empty) = (vec![r; 5], vec![2 * r; 6], Vec::<i64>::new());
    let group = TensorGroup::new(["made/a", "made/b", "made/empty"])?;
    kolo.scope(|s| {
        let views = [
            TensorMut::from(&mut a[..]),
            TensorMut::with_shape(&mut b[..], [2, 3]),
            TensorMut::from(&mut empty[..]),
        ];
        s.allreduce_group_async(&group, views, ReduceOp::Sum)?
            .wait()
    })?;
    assert_eq!(a, vec![n * (n - 1) / 2; 5]);
    assert_eq!(b, vec![n * (n - 1); 6]);
    if n > 1 {
        let mut fine = vec![1i64; 3];
        let mut uneven = vec![1i64; 3 + kolo.rank()];
        let group = TensorGroup::new(["made/fine", "made/uneven"])?;
        let failed =
            kolo.allreduce_group(&group, &mut [&mut fine[..], &mut uneven[..]], ReduceOp::Sum);
        let failed = expect_err(failed, "a group with a length that differs between ranks");
        assert!(
            matches!(failed, Error::Mismatch { .. }) && failed.to_string().contains("made/uneven"),
            "{failed}"
        );
        assert_eq!(fine, vec![n; 3], "a group's other tensors are reduced");
        assert_eq!(
            uneven,
            vec![1; 3 + kolo.rank()],
            "the refused tensor is untouched"
        );
    }
    let group = TensorGroup::new(["made/g0", "made/g1"])?;
    for step in 0..3 {
        let (mut g0, mut g1) = (vec![r + step; 4], vec![1i64; 9]);
        kolo.scope(|s| {
            s.allreduce_group_async(&group, [&mut g0[..], &mut g1[..]], ReduceOp::Sum)?
                .wait()
        })?;
        assert_eq!(g0, vec![n * (n - 1) / 2 + n * step; 4], "step {step}");
        assert_eq!(g1, vec![n; 9], "step {step}");
    }
    let mut one = [0i64; 4];
    let few = kolo.allreduce_group(&group, &mut [&mut one[..]], ReduceOp::Sum);
    let few = expect_err(few, "too few buffers");
    assert!(
        matches!(&few, Error::InvalidArgument { tensor, reason } if tensor == "made/g0" && reason.contains("2 tensors got 1 buffers")),
        "{few:?}"
    );
    Ok(None)
}
