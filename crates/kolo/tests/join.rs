//! Join: ranks with uneven numbers of batches.

mod common;

use common::config;
use kolo::ReduceOp;

#[test]
fn uneven_batches_then_join() {
    const STEPS: [usize; 4] = [3, 5, 4, 2];
    let results = kolo::threads::run(4, config(), |kolo| {
        let r = kolo.rank();
        for step in 0..STEPS[r] {
            // Only the ranks that still have batches contribute.
            let contributors: Vec<usize> = (0..4).filter(|&p| STEPS[p] > step).collect();
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
            let mean = contributors.iter().map(|&p| (p * 4) as f64).sum::<f64>()
                / contributors.len() as f64;
            assert_eq!(avg, vec![mean; 2]);

            let mut b = vec![r as i32; 2];
            kolo.broadcast(&format!("bcast/{step}"), &mut b, 1)?;
            assert_eq!(b, vec![1; 2]);
        }
        kolo.join()?;
        // After everyone joined, a new round starts: all ranks take part.
        let mut after = vec![1i32; 4];
        kolo.allreduce("after-join", &mut after, ReduceOp::Sum)?;
        assert_eq!(after, vec![4; 4]);
        Ok(STEPS[r])
    })
    .unwrap();
    assert_eq!(results, STEPS);
}

#[test]
fn join_twice_in_a_run() {
    kolo::threads::run(3, config(), |kolo| {
        for round in 0..2 {
            for step in 0..kolo.rank() + round {
                let mut x = vec![1i32; 2];
                kolo.allreduce(&format!("round{round}/{step}"), &mut x, ReduceOp::Sum)?;
                let contributors = (0..3).filter(|&p| p + round > step).count() as i32;
                assert_eq!(x, vec![contributors; 2]);
            }
            kolo.join()?;
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn joined_ranks_take_part_in_reduce_scatter_and_allgather() {
    kolo::threads::run(3, config(), |kolo| {
        let r = kolo.rank();
        if r == 2 {
            kolo.join()?;
            return Ok(());
        }
        // 1-D reduce-scatter over 3 ranks, rank 2 joined: 7 rows -> 3, 2, 2.
        let input: Vec<i32> = (0..7).map(|i| i * 10 + r as i32).collect();
        let mut shard = vec![0; kolo::split_rows(7, 3)[r]];
        kolo.reduce_scatter("rs", &input, &mut shard, ReduceOp::Sum)?;
        let start = [0, 3][r];
        let expected: Vec<i32> = (start..start + shard.len() as i32)
            .map(|i| i * 20 + 1)
            .collect();
        assert_eq!(shard, expected);

        // The joined rank contributes no rows.
        let gathered = kolo.allgather("gather", &vec![r as i64; 2 * (r + 1)])?;
        assert_eq!(gathered, [0, 0, 1, 1, 1, 1]);
        kolo.join()?;
        Ok(())
    })
    .unwrap();
}
