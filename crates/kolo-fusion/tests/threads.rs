//! The execution helpers on the real threads backend, n = 1..=4 ranks:
//! fused results equal unfused ones and sequential references.

use kolo_fusion::{
    fused_allgather, fused_allreduce, fused_reduce_scatter, Edge, FusionBuffers, FusionError, Phase,
};
use kolo_protocol::{Device, ReduceOp};
use kolo_transport::{Collectives, Generic, Scale, Topology};

fn ignore(_: Phase, _: Edge) {}

/// Small integers (exact in f64 sums and products) that differ per rank,
/// tensor and element.
fn value(rank: usize, tensor: usize, i: usize) -> f64 {
    ((rank * 7 + tensor * 3 + i) % 5) as f64 - 2.0
}

fn reduce(op: ReduceOp, values: impl Iterator<Item = f64>) -> f64 {
    let values: Vec<f64> = values.collect();
    match op {
        ReduceOp::Sum => values.iter().sum(),
        ReduceOp::Average => values.iter().sum::<f64>() / values.len() as f64,
        ReduceOp::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Product => values.iter().product(),
    }
}

const SCALE: Scale = Scale {
    prescale: 2.0,
    postscale: 0.5,
};

#[test]
fn fused_allreduce_matches_unfused_and_reference() {
    let lens = [5usize, 0, 1, 33, 8];
    for n in 1..=4 {
        for op in ReduceOp::ALL {
            let results = kolo_threads::run(n, |comm| {
                let rank = comm.rank();
                let make = || -> Vec<Vec<f64>> {
                    lens.iter()
                        .enumerate()
                        .map(|(t, &len)| (0..len).map(|i| value(rank, t, i)).collect())
                        .collect()
                };
                let mut fused = make();
                let mut bufs = FusionBuffers::new();
                let mut refs: Vec<&mut [f64]> = fused.iter_mut().map(Vec::as_mut_slice).collect();
                fused_allreduce(
                    comm,
                    &mut bufs,
                    Device::Cpu,
                    &mut refs,
                    op,
                    SCALE,
                    &mut ignore,
                )?;
                let mut unfused = make();
                for tensor in &mut unfused {
                    comm.allreduce(tensor, op, SCALE)?;
                }
                Ok::<_, FusionError>((fused, unfused))
            })
            .unwrap();
            for (fused, unfused) in results {
                assert_eq!(fused, unfused, "n = {n}, op = {op}");
                for (t, tensor) in fused.iter().enumerate() {
                    let expected: Vec<f64> = (0..lens[t])
                        .map(|i| reduce(op, (0..n).map(|r| 2.0 * value(r, t, i))) * 0.5)
                        .collect();
                    assert_eq!(tensor, &expected, "n = {n}, op = {op}, tensor {t}");
                }
            }
        }
    }
}

#[test]
fn fused_allreduce_on_threads_is_one_collective_over_the_tensors() {
    // Both paths of the threads backend: 3 x 10 f32 (small) and 3 x 30k f32.
    for len in [10usize, 30_000] {
        let results = kolo_threads::run(3, |comm| {
            let rank = comm.rank();
            let mut tensors: Vec<Vec<f32>> = (0..3)
                .map(|t| (0..len).map(|i| value(rank, t, i) as f32).collect())
                .collect();
            let mut refs: Vec<&mut [f32]> = tensors.iter_mut().map(Vec::as_mut_slice).collect();
            let mut bufs = FusionBuffers::new();
            let mut phases = Vec::new();
            fused_allreduce(
                comm,
                &mut bufs,
                Device::Cpu,
                &mut refs,
                ReduceOp::Average,
                SCALE,
                &mut |p, e| phases.push((p, e)),
            )?;
            let mut unfused: Vec<Vec<f32>> = (0..3)
                .map(|t| (0..len).map(|i| value(rank, t, i) as f32).collect())
                .collect();
            for tensor in &mut unfused {
                comm.allreduce(tensor, ReduceOp::Average, SCALE)?;
            }
            Ok::<_, FusionError>((tensors, unfused, phases, bufs.bytes_allocated()))
        })
        .unwrap();
        for (tensors, unfused, phases, allocated) in results {
            assert_eq!(
                phases,
                [
                    (Phase::Collective, Edge::Start),
                    (Phase::Collective, Edge::End)
                ]
            );
            assert_eq!(allocated, 0, "no fusion buffer on the threads backend");
            assert_eq!(tensors, unfused, "{len} elements");
        }
    }
}

#[test]
fn large_fused_allreduce_copies_in_parallel() {
    // 3 x 100k f64 = 2.4 MB, above the parallel copy threshold; through
    // `Generic`, which packs (the threads backend itself does not).
    let results = kolo_threads::run(2, |comm| {
        let mut comm = Generic(comm);
        let comm = &mut comm;
        let rank = comm.rank() as i64;
        let mut tensors: Vec<Vec<i64>> = (0..3)
            .map(|t| (0..100_000).map(|i| i * (t + 1) + rank).collect())
            .collect();
        let mut refs: Vec<&mut [i64]> = tensors.iter_mut().map(Vec::as_mut_slice).collect();
        let mut bufs = FusionBuffers::new();
        fused_allreduce(
            comm,
            &mut bufs,
            Device::Cpu,
            &mut refs,
            ReduceOp::Sum,
            Scale::NONE,
            &mut ignore,
        )?;
        Ok::<_, FusionError>(tensors)
    })
    .unwrap();
    for tensors in results {
        for (t, tensor) in tensors.iter().enumerate() {
            let t = t as i64;
            assert!(tensor
                .iter()
                .enumerate()
                .all(|(i, &v)| v == 2 * (i as i64) * (t + 1) + 1));
        }
    }
}

/// Rank r's first dimension of tensor t (some zero).
fn first_dim(t: usize, r: usize) -> u64 {
    ((t * 5 + r * 3) % 4) as u64
}

#[test]
fn fused_allgather_matches_unfused_and_reference() {
    let rows = [3usize, 1, 2];
    for n in 1..=4 {
        let first_dims: Vec<u64> = (0..rows.len())
            .flat_map(|t| (0..n).map(move |r| first_dim(t, r)))
            .collect();
        let input = |t: usize, r: usize| -> Vec<i32> {
            (0..first_dim(t, r) as usize * rows[t])
                .map(|i| (1000 * r + 100 * t + i) as i32)
                .collect()
        };
        let results = kolo_threads::run(n, |comm| {
            let rank = comm.rank();
            let inputs: Vec<Vec<i32>> = (0..rows.len()).map(|t| input(t, rank)).collect();
            let refs: Vec<&[i32]> = inputs.iter().map(Vec::as_slice).collect();
            let mut bufs = FusionBuffers::new();
            let mut phases = Vec::new();
            let fused = fused_allgather(
                comm,
                &mut bufs,
                Device::Cpu,
                &refs,
                &rows,
                &first_dims,
                &mut |p, e| phases.push((p, e)),
            )?;
            let mut unfused = Vec::new();
            for (t, tensor) in refs.iter().enumerate() {
                let dims = &first_dims[t * n..(t + 1) * n];
                unfused.push(
                    fused_allgather(
                        comm,
                        &mut bufs,
                        Device::Cpu,
                        &[tensor],
                        &rows[t..=t],
                        dims,
                        &mut ignore,
                    )?
                    .remove(0),
                );
            }
            Ok::<_, FusionError>((fused, unfused, phases.len()))
        })
        .unwrap();
        for (fused, unfused, phases) in results {
            assert_eq!(fused, unfused, "n = {n}");
            assert_eq!(phases, 6);
            for (t, tensor) in fused.iter().enumerate() {
                let expected: Vec<i32> = (0..n).flat_map(|r| input(t, r)).collect();
                assert_eq!(tensor, &expected, "n = {n}, tensor {t}");
            }
        }
    }
}

/// Elements of tensor t that rank r keeps (some zero).
fn block(t: usize, r: usize) -> usize {
    (t * 3 + r * 5) % 4
}

#[test]
fn fused_reduce_scatter_matches_unfused_and_reference() {
    let tensors = 3;
    for n in 1..=4 {
        let counts: Vec<Vec<usize>> = (0..tensors)
            .map(|t| (0..n).map(|r| block(t, r)).collect())
            .collect();
        let input = |t: usize, r: usize| -> Vec<f32> {
            (0..counts[t].iter().sum())
                .map(|i| value(r, t, i) as f32)
                .collect()
        };
        for op in [ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max] {
            let results = kolo_threads::run(n, |comm| {
                let rank = comm.rank();
                let inputs: Vec<Vec<f32>> = (0..tensors).map(|t| input(t, rank)).collect();
                let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
                let mut fused: Vec<Vec<f32>> =
                    counts.iter().map(|c| vec![f32::NAN; c[rank]]).collect();
                let mut outs: Vec<&mut [f32]> = fused.iter_mut().map(Vec::as_mut_slice).collect();
                let mut bufs = FusionBuffers::new();
                fused_reduce_scatter(
                    comm,
                    &mut bufs,
                    Device::Cpu,
                    &refs,
                    &mut outs,
                    &counts,
                    op,
                    SCALE,
                    &mut ignore,
                )?;
                let mut unfused: Vec<Vec<f32>> =
                    counts.iter().map(|c| vec![f32::NAN; c[rank]]).collect();
                for (t, out) in unfused.iter_mut().enumerate() {
                    comm.reduce_scatter(refs[t], out, &counts[t], op, SCALE)?;
                }
                Ok::<_, FusionError>((fused, unfused))
            })
            .unwrap();
            for (rank, (fused, unfused)) in results.into_iter().enumerate() {
                assert_eq!(fused, unfused, "n = {n}, op = {op}");
                for (t, out) in fused.iter().enumerate() {
                    let offset: usize = counts[t][..rank].iter().sum();
                    let expected: Vec<f32> = (offset..offset + counts[t][rank])
                        .map(|i| (reduce(op, (0..n).map(|r| 2.0 * value(r, t, i))) * 0.5) as f32)
                        .collect();
                    assert_eq!(
                        out, &expected,
                        "n = {n}, op = {op}, tensor {t}, rank {rank}"
                    );
                }
            }
        }
    }
}

/// A value with a fraction, so that the 16-bit types round it.
fn fractional(rank: usize, tensor: usize, i: usize) -> f64 {
    value(rank, tensor, i) / 3.0 + 0.25 + (i % 7) as f64 * 0.01
}

/// The compressed allreduce of f32 and f64 tensors through f16 and bf16,
/// every op, 1 to 4 ranks: each result within the wire type's rounding of
/// the exact reduction — one rounding of each input and one per step of
/// the ring, so `(n + 2)` units of the wire type's precision times the
/// magnitude of what was reduced.
#[test]
fn compressed_allreduce_stays_within_the_wire_types_precision() {
    use kolo_fusion::compressed_allreduce;
    use kolo_protocol::Compression;
    let lens = [5usize, 0, 1, 33, 8];
    for compression in [Compression::Fp16, Compression::Bf16] {
        let unit = match compression {
            Compression::Fp16 => 2f64.powi(-11),
            _ => 2f64.powi(-8),
        };
        for n in 1..=4 {
            for op in ReduceOp::ALL {
                let check = |results: Vec<Vec<Vec<f64>>>| {
                    for (rank, tensors) in results.iter().enumerate() {
                        for (t, tensor) in tensors.iter().enumerate() {
                            for (i, &got) in tensor.iter().enumerate() {
                                let inputs = (0..n).map(|r| fractional(r, t, i) * SCALE.prescale);
                                let exact = reduce(op, inputs.clone()) * SCALE.postscale;
                                let magnitude = match op {
                                    ReduceOp::Sum | ReduceOp::Average => {
                                        inputs.map(f64::abs).sum::<f64>() * SCALE.postscale
                                            / if op == ReduceOp::Average {
                                                n as f64
                                            } else {
                                                1.0
                                            }
                                    }
                                    _ => exact.abs(),
                                };
                                let bound = (n + 2) as f64 * unit * magnitude + 1e-12;
                                assert!(
                                    (got - exact).abs() <= bound,
                                    "{compression} {op:?} n={n} rank {rank} tensor {t}[{i}]: \
                                     {got} against {exact} (bound {bound})"
                                );
                            }
                        }
                    }
                };
                let f64s = kolo_threads::run(n, |comm| {
                    let rank = comm.rank();
                    let mut data: Vec<Vec<f64>> = lens
                        .iter()
                        .enumerate()
                        .map(|(t, &len)| (0..len).map(|i| fractional(rank, t, i)).collect())
                        .collect();
                    let mut bufs = FusionBuffers::new();
                    let mut refs: Vec<&mut [f64]> =
                        data.iter_mut().map(Vec::as_mut_slice).collect();
                    compressed_allreduce(
                        comm,
                        &mut bufs,
                        Device::Cpu,
                        &mut refs,
                        op,
                        SCALE,
                        compression,
                        &mut ignore,
                    )?;
                    Ok::<_, FusionError>(data)
                })
                .expect("the compressed f64 allreduce");
                check(f64s);
                let f32s = kolo_threads::run(n, |comm| {
                    let rank = comm.rank();
                    let mut data: Vec<Vec<f32>> = lens
                        .iter()
                        .enumerate()
                        .map(|(t, &len)| (0..len).map(|i| fractional(rank, t, i) as f32).collect())
                        .collect();
                    let mut bufs = FusionBuffers::new();
                    let mut refs: Vec<&mut [f32]> =
                        data.iter_mut().map(Vec::as_mut_slice).collect();
                    compressed_allreduce(
                        comm,
                        &mut bufs,
                        Device::Cpu,
                        &mut refs,
                        op,
                        SCALE,
                        compression,
                        &mut ignore,
                    )?;
                    Ok::<_, FusionError>(data)
                })
                .expect("the compressed f32 allreduce");
                check(
                    f32s.into_iter()
                        .map(|ts| {
                            ts.into_iter()
                                .map(|t| t.into_iter().map(f64::from).collect())
                                .collect()
                        })
                        .collect(),
                );
            }
        }
    }
}

/// Integer tensors, and any tensor without a compression, travel as they
/// are: the compressed allreduce's results are the plain one's, exactly.
#[test]
fn compression_leaves_other_types_exact() {
    use kolo_fusion::compressed_allreduce;
    use kolo_protocol::Compression;
    let results = kolo_threads::run(3, |comm| {
        let rank = comm.rank() as i64;
        let mut ints = vec![vec![rank * 1_000_003; 9], vec![rank - 7; 4]];
        let mut bufs = FusionBuffers::new();
        let mut refs: Vec<&mut [i64]> = ints.iter_mut().map(Vec::as_mut_slice).collect();
        compressed_allreduce(
            comm,
            &mut bufs,
            Device::Cpu,
            &mut refs,
            ReduceOp::Sum,
            Scale::NONE,
            Compression::Fp16,
            &mut ignore,
        )?;
        let mut floats = vec![vec![1.0f32 / 3.0 + rank as f32; 5]];
        let mut refs: Vec<&mut [f32]> = floats.iter_mut().map(Vec::as_mut_slice).collect();
        compressed_allreduce(
            comm,
            &mut bufs,
            Device::Cpu,
            &mut refs,
            ReduceOp::Sum,
            Scale::NONE,
            Compression::None,
            &mut ignore,
        )?;
        Ok::<_, FusionError>((ints, floats))
    })
    .expect("the allreduces");
    for (ints, floats) in results {
        assert_eq!(ints, vec![vec![3 * 1_000_003; 9], vec![3 - 21; 4]]);
        let exact = (0..3).map(|r| 1.0f32 / 3.0 + r as f32).sum::<f32>();
        assert!(
            floats[0].iter().all(|&x| (x - exact).abs() <= 1e-6),
            "{floats:?}"
        );
    }
}
