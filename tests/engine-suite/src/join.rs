//! Join: ranks with uneven numbers of batches.

use crate::Digest;
use kolo::{Error, Kolo, ReduceOp};

/// Batches of rank `r` in [`uneven_batches_then_join`]: rank 1 has the
/// most (it is the broadcast root of every step).
fn batches(r: usize) -> usize {
    match r {
        0..=3 => [3, 5, 4, 2][r],
        _ => 2 + r % 3,
    }
}

/// Each rank runs its own number of steps, then joins; at every step only
/// the ranks that still have batches contribute (sum, min, average over
/// them, a broadcast). After everyone joined, all ranks take part again.
pub fn uneven_batches_then_join(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    for step in 0..batches(r) {
        let contributors: Vec<usize> = (0..n).filter(|&p| batches(p) > step).collect();
        let mut sum = vec![(r + 1) as i64; 6];
        kolo.allreduce(&format!("sum/{step}"), &mut sum, ReduceOp::Sum)?;
        let expected: i64 = contributors.iter().map(|&p| (p + 1) as i64).sum();
        assert_eq!(sum, vec![expected; 6], "rank {r} step {step}");

        let mut min = vec![(10 + r) as i32; 3];
        kolo.allreduce(&format!("min/{step}"), &mut min, ReduceOp::Min)?;
        assert_eq!(min, vec![(10 + contributors[0]) as i32; 3]);

        // Averaged over the contributing ranks only.
        let mut avg = vec![(r * 4) as f64; 2];
        kolo.allreduce(&format!("avg/{step}"), &mut avg, ReduceOp::Average)?;
        let mean =
            contributors.iter().map(|&p| (p * 4) as f64).sum::<f64>() / contributors.len() as f64;
        assert_eq!(avg, vec![mean; 2]);

        // From rank 1, which has the most batches (rank 0 when alone).
        let root = 1.min(n - 1);
        let mut b = vec![r as i32; 2];
        kolo.broadcast(&format!("bcast/{step}"), &mut b, root)?;
        assert_eq!(b, vec![root as i32; 2]);
    }
    // Rank 1 has the most batches: its last steps run alone, after every
    // other rank's join, so it is the last to join.
    let last = kolo.join()?;
    assert_eq!(
        last,
        if n > 1 { 1 } else { 0 },
        "rank {r}: the last to join"
    );
    // After everyone joined, a new round starts: all ranks take part.
    let mut after = vec![1i32; 4];
    kolo.allreduce("after-join", &mut after, ReduceOp::Sum)?;
    assert_eq!(after, vec![n as i32; 4]);
    Ok(None)
}

/// Two rounds of uneven steps, each ended by a join.
pub fn join_twice(kolo: &Kolo) -> Result<Digest, Error> {
    let n = kolo.size();
    for round in 0..2 {
        for step in 0..kolo.rank() + round {
            let mut x = vec![1i32; 2];
            kolo.allreduce(&format!("round{round}/{step}"), &mut x, ReduceOp::Sum)?;
            let contributors = (0..n).filter(|&p| p + round > step).count() as i32;
            assert_eq!(x, vec![contributors; 2]);
        }
        // The highest rank has the most steps, its last ones alone.
        assert_eq!(kolo.join()?, n - 1, "round {round}: the last to join");
    }
    Ok(None)
}

/// The last rank joins at once; the others reduce-scatter (it contributes
/// nothing but still gets its shard's rows counted) and allgather (it
/// contributes no rows).
pub fn joined_rank_in_rs_and_allgather(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    if r == n - 1 {
        let last = kolo.join()?;
        assert!(
            n == 1 || last < n - 1,
            "rank {r} joined first, not last ({last})"
        );
        return Ok(None);
    }
    let split = kolo::split_rows(7, n);
    let input: Vec<i32> = (0..7).map(|i| i * 10 + r as i32).collect();
    let mut shard = vec![0; split[r]];
    kolo.reduce_scatter("join/rs", &input, &mut shard, ReduceOp::Sum)?;
    let start: usize = split[..r].iter().sum();
    let live = (n - 1) as i32;
    let expected: Vec<i32> = (start..start + split[r])
        .map(|i| i as i32 * 10 * live + live * (live - 1) / 2)
        .collect();
    assert_eq!(shard, expected);

    let gathered = kolo.allgather("join/gather", &vec![r as i64; 2 * (r + 1)])?;
    let expected: Vec<i64> = (0..n - 1)
        .flat_map(|p| std::iter::repeat_n(p as i64, 2 * (p + 1)))
        .collect();
    assert_eq!(gathered, expected);
    let last = kolo.join()?;
    assert!(
        last < n - 1,
        "rank {} joined first, not last ({last})",
        n - 1
    );
    Ok(None)
}
