//! `allreduce_segments`: bit for bit `allreduce` of the packed
//! concatenation on both paths, for random segmentations, dtypes, ops,
//! scales and 1 to 8 ranks; mismatches and failures on every rank.

use super::bomb::{Bomb, ARMED};
use super::on_ranks;
use crate::allreduce::takes_small_path;
use crate::run;
use half::{bf16, f16};
use kolo_protocol::ReduceOp;
use kolo_transport::byte_view::as_bytes;
use kolo_transport::{Collectives, Element, Scale, Topology, TransportError};
use proptest::prelude::*;

/// A value whose sums round differently in another order: not a small
/// integer (those would hide a wrong reduction order).
fn messy(rank: usize, i: usize) -> f64 {
    let x = ((rank * 7919 + i * 104_729) % 1_000_003) as f64;
    (x / 1_000_003.0 - 0.5) * 3.7 + rank as f64 * 0.013
}

fn make<T: Element>(rank: usize, i: usize, op: ReduceOp) -> T {
    let v = messy(rank, i);
    match (op, T::DTYPE.is_float()) {
        // Products of floats near 1 stay finite on 8 ranks.
        (ReduceOp::Product, true) => T::from_f64(1.0 + v / 16.0),
        (_, true) => T::from_f64(v),
        (ReduceOp::Product, false) => T::from_f64((i % 3) as f64 + 1.0),
        (_, false) => T::from_f64((v * 20.0).round()),
    }
}

const SCALED: Scale = Scale {
    prescale: 0.3,
    postscale: 1.7,
};

/// Runs `allreduce_segments` over `lens` on `n` ranks and `allreduce` over
/// the packed concatenation of the same inputs; both results per rank.
fn both<T: Element>(
    n: usize,
    lens: &[usize],
    op: ReduceOp,
    scale: Scale,
) -> Vec<(Vec<Vec<T>>, Vec<T>)> {
    on_ranks(n, |comm| {
        let rank = comm.rank();
        let mut start = 0;
        let mut segments: Vec<Vec<T>> = Vec::with_capacity(lens.len());
        for &len in lens {
            segments.push((start..start + len).map(|i| make(rank, i, op)).collect());
            start += len;
        }
        let mut packed: Vec<T> = segments.concat();
        let mut views: Vec<&mut [T]> = segments.iter_mut().map(Vec::as_mut_slice).collect();
        comm.allreduce_segments(&mut views, op, scale)?;
        comm.allreduce(&mut packed, op, scale)?;
        Ok((segments, packed))
    })
}

/// Asserts that every rank's segments are bit for bit its packed result.
fn assert_identical<T: Element>(n: usize, lens: &[usize], op: ReduceOp, scale: Scale) {
    for (rank, (segments, packed)) in both::<T>(n, lens, op, scale).into_iter().enumerate() {
        let concatenated = segments.concat();
        assert!(
            as_bytes(&concatenated) == as_bytes(&packed),
            "{n} ranks, {} segments {lens:?}, {} {op:?} {scale:?}, rank {rank}: \
             first difference at {:?}",
            lens.len(),
            T::DTYPE,
            concatenated.iter().zip(&packed).position(|(a, b)| a != b)
        );
    }
}

fn assert_identical_for(dtype: usize, n: usize, lens: &[usize], op: ReduceOp, scale: Scale) {
    match dtype {
        0 => assert_identical::<f32>(n, lens, op, scale),
        1 => assert_identical::<f16>(n, lens, op, scale),
        2 => assert_identical::<bf16>(n, lens, op, scale),
        3 => assert_identical::<f64>(n, lens, op, scale),
        4 => assert_identical::<i32>(n, lens, op, scale),
        _ => assert_identical::<u8>(n, lens, op, scale),
    }
}

#[test]
fn edge_segmentations_on_both_paths_for_1_to_8_ranks() {
    for n in 1..=8 {
        let layouts: [&[usize]; 7] = [
            &[],
            &[0],
            &[0, 0, 0],
            &[5],
            &[30_011],
            &[0, 1, n - 1, 2 * n + 1, 1021, 0],
            &[1, 0, 20_000, 3, 0, 4_099, 1],
        ];
        for lens in layouts {
            for op in ReduceOp::ALL {
                assert_identical::<f32>(n, lens, op, Scale::NONE);
            }
            assert_identical::<f16>(n, lens, ReduceOp::Average, SCALED);
            assert_identical::<i32>(n, lens, ReduceOp::Sum, SCALED);
        }
    }
}

/// One rank's allreduce is its input with the scale factors applied
/// (`post * (pre * x)`), on both paths, segmented or packed.
fn assert_one_rank_keeps_its_input<T: Element>(op: ReduceOp, scale: Scale) {
    let lens = [5, 30_011, 0, 7];
    for (segments, packed) in both::<T>(1, &lens, op, scale) {
        let mut expected: Vec<T> = (0..packed.len()).map(|i| make(0, i, op)).collect();
        T::scale(&mut expected, scale.prescale);
        T::scale(&mut expected, scale.postscale_for(op, 1));
        let concatenated = segments.concat();
        for (what, got) in [("segments", &concatenated), ("packed", &packed)] {
            assert!(
                as_bytes(got) == as_bytes(&expected),
                "1 rank, {} {op:?} {scale:?}, {what}: first difference at {:?}",
                T::DTYPE,
                got.iter().zip(&expected).position(|(a, b)| a != b)
            );
        }
    }
}

#[test]
fn one_rank_applies_only_the_scale_factors() {
    for op in ReduceOp::ALL {
        for scale in [Scale::NONE, SCALED] {
            assert_one_rank_keeps_its_input::<f32>(op, scale);
            assert_one_rank_keeps_its_input::<f16>(op, scale);
            assert_one_rank_keeps_its_input::<bf16>(op, scale);
            assert_one_rank_keeps_its_input::<f64>(op, scale);
            assert_one_rank_keeps_its_input::<i32>(op, scale);
            assert_one_rank_keeps_its_input::<u8>(op, scale);
        }
    }
}

#[test]
fn a_thousand_segments_of_a_thousand_elements() {
    let lens = vec![1024; 1000];
    for n in [2, 3] {
        assert_identical::<f32>(n, &lens, ReduceOp::Sum, Scale::NONE);
        assert_identical::<bf16>(n, &lens, ReduceOp::Average, SCALED);
    }
}

#[test]
fn both_paths_are_exercised() {
    // The layouts above: 5 f32 take the small path, 30,011 the in-place one.
    for n in 1..=8 {
        assert!(takes_small_path(5 * 4, n));
        assert!(!takes_small_path(30_011 * 4, n));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random segmentations on 1 to 8 ranks: bit for bit `allreduce` of
    /// the packed concatenation.
    #[test]
    fn random_segmentations_match_allreduce_bit_for_bit(
        n in 1usize..=8,
        lens in prop::collection::vec(
            prop_oneof![3 => 0usize..64, 2 => 0usize..3_000, 1 => 3_000usize..12_000],
            0..24,
        ),
        dtype in 0usize..6,
        op in prop::sample::select(ReduceOp::ALL.to_vec()),
        scaled in any::<bool>(),
    ) {
        let scale = if scaled { SCALED } else { Scale::NONE };
        assert_identical_for(dtype, n, &lens, op, scale);
    }
}

#[test]
fn mismatched_segments_are_an_error_on_every_rank_and_the_next_call_works() {
    // (rank 0's lengths, rank 2's lengths, the message): both paths, the
    // two paths at once, a different count and a different length.
    let cases: [(&[usize], &[usize], &str); 4] = [
        (
            &[3, 4],
            &[3, 50_000],
            "allreduce_segments: rank 2's segment 1 holds 50000 elements but rank 0's holds 4",
        ),
        (
            &[3, 4],
            &[3, 5],
            "allreduce_segments: rank 2's segment 1 holds 5 elements but rank 0's holds 4",
        ),
        (
            &[30_000, 7],
            &[30_000, 7, 0],
            "allreduce_segments: rank 2 passed 3 segments but rank 0 passed 2",
        ),
        (
            &[30_000, 7],
            &[7, 30_000],
            "allreduce_segments: rank 2's segment 0 holds 7 elements but rank 0's holds 30000",
        ),
    ];
    for (lens, odd, message) in cases {
        let results = on_ranks(4, |comm| {
            let mine = if comm.rank() == 2 { odd } else { lens };
            let mut segments: Vec<Vec<i64>> = mine.iter().map(|&len| vec![1; len]).collect();
            let mut views: Vec<&mut [i64]> = segments.iter_mut().map(Vec::as_mut_slice).collect();
            let err = comm
                .allreduce_segments(&mut views, ReduceOp::Sum, Scale::NONE)
                .unwrap_err();
            let untouched = segments.iter().all(|s| s.iter().all(|&x| x == 1));
            let mut next = [vec![1i64; 3], vec![2i64; 40_000]];
            let [a, b] = &mut next;
            comm.allreduce_segments(&mut [&mut a[..], &mut b[..]], ReduceOp::Sum, Scale::NONE)?;
            Ok((err, untouched, next))
        });
        for (err, untouched, [a, b]) in results {
            assert_eq!(err, TransportError::InvalidArgument(message.into()));
            assert!(untouched, "a rejected call leaves the segments alone");
            assert!(a == vec![4; 3] && b == vec![8; 40_000]);
        }
    }
}

#[test]
fn a_different_op_or_collective_is_an_error_on_every_rank() {
    let results = on_ranks(3, |comm| {
        let mut buf = vec![1.0f32; 6];
        let op = if comm.rank() == 1 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        let (a, b) = buf.split_at_mut(2);
        let op_err = comm
            .allreduce_segments(&mut [a, b], op, Scale::NONE)
            .unwrap_err();
        let kind_err = if comm.rank() == 2 {
            comm.allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)
        } else {
            comm.allreduce_segments(&mut [&mut buf[..]], ReduceOp::Sum, Scale::NONE)
        }
        .unwrap_err();
        Ok((op_err.to_string(), kind_err.to_string()))
    });
    for (op_err, kind_err) in results {
        assert!(
            op_err.contains("allreduce_segments: rank 1 asked for max while rank 0 asked for sum"),
            "{op_err}"
        );
        assert!(
            kind_err.contains(
                "collective mismatch: rank 2 called allreduce while rank 0 called allreduce_segments"
            ),
            "{kind_err}"
        );
    }
}

#[test]
fn a_panic_inside_the_segment_round_fails_it_on_every_rank() {
    for lens in [[3usize, 5], [60_000, 40_000]] {
        let err = run(3, |comm| {
            ARMED.set(comm.rank() == 1);
            let mut segments: Vec<Vec<Bomb>> = lens.iter().map(|&len| vec![Bomb(1); len]).collect();
            let mut views: Vec<&mut [Bomb]> = segments.iter_mut().map(Vec::as_mut_slice).collect();
            // Three ranks take the scratch path (`reduce_many`) on both paths.
            comm.allreduce_segments(&mut views, ReduceOp::Sum, Scale::NONE)
        })
        .unwrap_err();
        assert_eq!(err.failures[0].rank, 1, "{err}");
        assert!(err.failures[0].panicked);
        assert_eq!(err.failures.len(), 3, "{err}");
        assert!(
            err.failures[1..]
                .iter()
                .all(|f| f.message.contains("rank 1 abandoned allreduce_segments")),
            "{err}"
        );
    }
}

#[test]
fn a_rank_failing_between_segment_rounds_fails_every_rank() {
    let err = run(4, |comm| {
        for round in 0..6 {
            if comm.rank() == 3 && round == 4 {
                return Err(TransportError::Backend("stopped".into()));
            }
            let len = if round % 2 == 0 { 2 } else { 20_000 };
            let mut a = vec![1i32; len];
            let mut b = [2i32; 3];
            comm.allreduce_segments(&mut [&mut a[..], &mut b[..]], ReduceOp::Sum, Scale::NONE)?;
            assert_eq!((a[len - 1], b[2]), (4, 8));
        }
        Ok(())
    })
    .unwrap_err();
    assert_eq!(err.failures.len(), 4, "{err}");
    assert_eq!(err.failures[0].rank, 3);
    assert!(err.failures[1..]
        .iter()
        .all(|f| f.message.starts_with("rank 3 failed")));
}

#[test]
fn the_segment_table_is_reused_across_calls() {
    let results = on_ranks(2, |comm| {
        let mut tables = Vec::new();
        for len in [20_000usize, 3, 20_000] {
            let mut segments: Vec<Vec<f32>> = (0..50).map(|_| vec![1.0; len]).collect();
            let mut views: Vec<&mut [f32]> = segments.iter_mut().map(Vec::as_mut_slice).collect();
            comm.allreduce_segments(&mut views, ReduceOp::Sum, Scale::NONE)?;
            assert!(segments.iter().all(|s| s.iter().all(|&x| x == 2.0)));
            tables.push(comm.segments.allocation());
        }
        Ok(tables)
    });
    for tables in results {
        assert!(tables.windows(2).all(|w| w[0] == w[1]), "{tables:?}");
    }
}
