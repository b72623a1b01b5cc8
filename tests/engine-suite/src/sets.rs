//! Process sets: disjoint and overlapping sets, one tensor name in the
//! world and in two sets at once, a set's pending tensor not holding up
//! the world or another set, tensor groups on a set, a set's errors
//! naming it, and the members' list checked.

use crate::{expect_err, Digest};
use kolo::{Error, Kolo, ReduceOp, TensorGroup};

/// Every rank's value in these cases: distinct per world rank, so a sum
/// tells which ranks took part.
fn value(world_rank: usize) -> i64 {
    1 << world_rank
}

/// The sum of [`value`] over `members`.
fn sum(members: &[usize]) -> i64 {
    members.iter().map(|&r| value(r)).sum()
}

/// The sets of a world of `n` ranks: the even and the odd ranks
/// (disjoint), and the ranks below the last with the ranks 0 and last
/// (overlapping at rank 0; with two ranks, `[0]` and `[0, 1]`).
fn layouts(n: usize) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let parity: Vec<usize> = (0..n).filter(|r| r % 2 == 0).collect();
    let head: Vec<usize> = (0..n - 1).collect();
    (parity, head, ends(n))
}

/// False where the backend refuses sets by design, after checking that
/// it says why (MPI without `MPI_THREAD_MULTIPLE`: a set's engine needs
/// a thread of its own; the GPU engines, which make none yet): a set of
/// this rank alone, which needs no peer.
fn sets_made(kolo: &Kolo) -> Result<bool, Error> {
    match kolo.process_set(&[kolo.rank()]) {
        Ok(alone) => {
            let mut x = [3i16];
            alone.allreduce("sets/alone", &mut x[..], ReduceOp::Sum)?;
            assert_eq!(x, [3]);
            Ok(true)
        }
        Err(Error::ProcessSet { reason, .. }) if reason.contains("MPI_THREAD_MULTIPLE") => {
            Ok(false)
        }
        Err(Error::ProcessSet { reason, .. })
            if kolo.gpu().is_some() && reason.contains("cannot make process sets") =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Ranks 0 and the last (one rank in a world of one).
fn ends(n: usize) -> Vec<usize> {
    let mut ends = vec![0, n - 1];
    ends.dedup();
    ends
}

/// Disjoint and overlapping sets, with the same name in flight in the
/// world and in every set of the rank at once, and a tensor group.
pub fn disjoint_and_overlapping(kolo: &Kolo) -> Result<Digest, Error> {
    if !sets_made(kolo)? {
        return Ok(None);
    }
    let (me, n) = (kolo.rank(), kolo.size());
    let (evens, head, ends) = layouts(n);
    let parity: Vec<usize> = if me % 2 == 0 {
        evens
    } else {
        (0..n).filter(|r| r % 2 == 1).collect()
    };
    let parity_set = kolo.process_set(&parity)?;
    assert_eq!(parity_set.members(), parity.as_slice());
    assert_eq!(parity_set.size(), parity.len());
    assert_eq!(parity_set.world_rank(parity_set.rank()), Some(me));
    let head_set = head
        .contains(&me)
        .then(|| kolo.process_set(&head))
        .transpose()?;
    let ends_set = ends
        .contains(&me)
        .then(|| kolo.process_set(&ends))
        .transpose()?;
    let world_sum = sum(&(0..n).collect::<Vec<_>>());
    for step in 0..3i64 {
        let mut in_world = vec![value(me) + step; 5];
        let mut in_parity = vec![value(me) + step; 7];
        let mut in_head = vec![value(me) + step; 3];
        let mut in_ends = vec![value(me) + step; 9];
        // All four in flight at once under one name.
        kolo.scope(|w| {
            let world = w.allreduce_async("sets/x", &mut in_world, ReduceOp::Sum)?;
            parity_set.scope(|p| {
                let parity = p.allreduce_async("sets/x", &mut in_parity, ReduceOp::Sum)?;
                let head = head_set
                    .as_ref()
                    .map(|set| set.allreduce("sets/x", &mut in_head, ReduceOp::Sum));
                let ends = ends_set
                    .as_ref()
                    .map(|set| set.allreduce("sets/x", &mut in_ends, ReduceOp::Sum));
                parity.wait()?;
                head.transpose()?;
                ends.transpose()?;
                Ok(())
            })?;
            world.wait()
        })?;
        let shifted = |members: &[usize]| sum(members) + step * members.len() as i64;
        assert_eq!(in_world, vec![world_sum + step * n as i64; 5]);
        assert_eq!(
            in_parity,
            vec![shifted(&parity); 7],
            "rank {me} in {parity:?}"
        );
        if head_set.is_some() {
            assert_eq!(in_head, vec![shifted(&head); 3], "rank {me} in {head:?}");
        }
        if ends_set.is_some() {
            assert_eq!(in_ends, vec![shifted(&ends); 9], "rank {me} in {ends:?}");
        }
    }
    // A tensor group and a gather on a set, numbered within it.
    let group = TensorGroup::new(["sets/g0", "sets/g1"])?;
    let mut g0 = vec![1.0f32; 4];
    let mut g1 = vec![value(me) as f32; 2];
    parity_set.allreduce_group(&group, [&mut g0[..], &mut g1[..]], ReduceOp::Max)?;
    assert_eq!(g0, vec![1.0; 4]);
    assert_eq!(g1, vec![value(*parity.last().unwrap()) as f32; 2]);
    let gathered = parity_set.allgather("sets/gather", &[parity_set.rank() as i32][..])?;
    let want: Vec<i32> = (0..parity.len() as i32).collect();
    assert_eq!(gathered, want);
    // A second set of the same members is a set of its own.
    let again = kolo.process_set(&parity)?;
    let mut y = [1u8];
    again.allreduce("sets/x", &mut y[..], ReduceOp::Sum)?;
    assert_eq!(y[0] as usize, parity.len());
    Ok(None)
}

/// A set's tensor pending on one member does not hold up the world or
/// another set: rank 0 submits into the set `[0, 1]` first, rank 1 only
/// after an allreduce in the world (and rank 0 after one in the set
/// `[0, last]`) that need rank 0 while its set tensor waits.
pub fn never_block_one_another(kolo: &Kolo) -> Result<Digest, Error> {
    if !sets_made(kolo)? {
        return Ok(None);
    }
    let (me, n) = (kolo.rank(), kolo.size());
    let pair: Vec<usize> = (0..n.min(2)).collect();
    let ends = ends(n);
    let pair_set = pair
        .contains(&me)
        .then(|| kolo.process_set(&pair))
        .transpose()?;
    let ends_set = ends
        .contains(&me)
        .then(|| kolo.process_set(&ends))
        .transpose()?;
    let mut late = [value(me)];
    let mut world = [value(me)];
    let mut other = [value(me)];
    if me == 0 {
        let pair_set = pair_set.as_ref().expect("rank 0 is in [0, 1]");
        pair_set.scope(|s| {
            let pending = s.allreduce_async("sets/late", &mut late[..], ReduceOp::Sum)?;
            if let Some(set) = &ends_set {
                set.allreduce("sets/other", &mut other[..], ReduceOp::Sum)?;
            }
            kolo.allreduce("sets/world", &mut world[..], ReduceOp::Sum)?;
            pending.wait()
        })?;
    } else {
        if let Some(set) = &ends_set {
            set.allreduce("sets/other", &mut other[..], ReduceOp::Sum)?;
        }
        kolo.allreduce("sets/world", &mut world[..], ReduceOp::Sum)?;
        if let Some(set) = &pair_set {
            set.allreduce("sets/late", &mut late[..], ReduceOp::Sum)?;
        }
    }
    assert_eq!(world[0], sum(&(0..n).collect::<Vec<_>>()));
    if pair_set.is_some() {
        assert_eq!(late[0], sum(&pair));
    }
    if ends_set.is_some() {
        assert_eq!(other[0], sum(&ends));
    }
    Ok(None)
}

/// Errors: a bad list fails on the rank that passed it, naming the
/// values; a mismatch inside a set names the set and its world ranks; the
/// world and the set go on working afterwards.
pub fn errors_name_the_set(kolo: &Kolo) -> Result<Digest, Error> {
    if !sets_made(kolo)? {
        return Ok(None);
    }
    let (me, n) = (kolo.rank(), kolo.size());
    let message = |members: &[usize]| {
        let e = expect_err(kolo.process_set(members), "a bad member list");
        assert!(matches!(e, Error::ProcessSet { .. }), "{e:?}");
        e.to_string()
    };
    assert!(message(&[me, n]).contains(&format!("rank {n} is out of range")));
    assert!(message(&[me, me]).contains(&format!("rank {me} is listed twice")));
    if n > 1 {
        let outsider = message(&[(me + 1) % n]);
        assert!(
            outsider.contains(&format!("rank {me} is not a member")),
            "{outsider}"
        );
    }
    // Every rank in one set of all ranks but numbered in reverse order
    // of creation: a mismatched shape between its members.
    let all: Vec<usize> = (0..n).rev().collect();
    let set = kolo.process_set(&all)?;
    if n > 1 {
        let len = if me == 0 { 3 } else { 2 };
        let mut x = vec![1.0f32; len];
        let e = expect_err(
            set.allreduce("sets/bad", &mut x, ReduceOp::Sum),
            "a shape mismatch in a set",
        );
        let text = e.to_string();
        assert!(matches!(e, Error::Mismatch { .. }), "{e:?}");
        assert!(text.contains("sets/bad"), "{text}");
        let members: Vec<usize> = (0..n).collect();
        assert!(text.contains(&format!("process set {members:?}")), "{text}");
    }
    let mut ok = [1i32; 2];
    set.allreduce("sets/good", &mut ok[..], ReduceOp::Sum)?;
    assert_eq!(ok, [n as i32; 2]);
    let inner = expect_err(set.process_set(&[0]), "a set of a set");
    assert!(
        inner.to_string().contains("make sets from the world's"),
        "{inner}"
    );
    Ok(None)
}
