use super::{on_ranks, value};
use crate::allreduce::takes_small_path;
use half::f16;
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Element, Scale, Topology, Transaction};

/// i32 lengths on both sides of the small-message threshold for every rank
/// count, most not divisible by the rank count or a cache line.
const LENS: [usize; 6] = [0, 1, 17, 300, 5_000, 20_011];

#[test]
fn allreduce_i32_sum_small_and_large_for_1_to_8_ranks() {
    for n in 1..=8 {
        let paths: Vec<bool> = LENS
            .iter()
            .map(|len| takes_small_path(len * 4, n))
            .collect();
        assert!(paths.contains(&true) && paths.contains(&false), "{n} ranks");
        for len in LENS {
            let results = on_ranks(n, |comm| {
                let mut buf: Vec<i32> = (0..len).map(|i| value(comm.rank(), i)).collect();
                comm.allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)?;
                Ok(buf)
            });
            let expected: Vec<i32> = (0..len)
                .map(|i| (0..n).map(|r| value(r, i)).sum())
                .collect();
            for (rank, got) in results.iter().enumerate() {
                assert_eq!(got, &expected, "{n} ranks, {len} elements, rank {rank}");
            }
        }
    }
}

/// `postscale * op_r(prescale * x_r)` one element at a time, with the kernels.
fn reference<T: Element>(inputs: &[Vec<T>], op: ReduceOp, scale: Scale) -> Vec<T> {
    let scaled: Vec<Vec<T>> = inputs
        .iter()
        .map(|v| {
            let mut v = v.clone();
            T::scale(&mut v, scale.prescale);
            v
        })
        .collect();
    let srcs: Vec<&[T]> = scaled.iter().map(Vec::as_slice).collect();
    let mut out = vec![T::default(); inputs[0].len()];
    T::reduce_many(&mut out, &srcs, op);
    T::scale(&mut out, scale.postscale_for(op, inputs.len()));
    out
}

fn check_all_ops<T: Element>(n: usize, len: usize, make: impl Fn(usize, usize) -> T + Sync) {
    let scales = [
        Scale::NONE,
        Scale {
            prescale: 0.5,
            postscale: 3.0,
        },
    ];
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| (0..len).map(|i| make(r, i)).collect())
        .collect();
    for op in ReduceOp::ALL {
        for scale in scales {
            let results = on_ranks(n, |comm| {
                let mut buf = inputs[comm.rank()].clone();
                comm.allreduce(&mut buf, op, scale)?;
                Ok(buf)
            });
            let expected = reference(&inputs, op, scale);
            for got in results {
                assert!(
                    got == expected,
                    "{n} ranks, {len} {} elements, {op:?}, {scale:?}",
                    T::DTYPE
                );
            }
        }
    }
}

#[test]
fn allreduce_every_op_and_scale_matches_the_kernels() {
    for (n, len) in [(3, 10), (2, 2_000), (3, 20_011), (4, 9_000)] {
        check_all_ops::<i32>(n, len, value);
        check_all_ops::<f32>(n, len, |r, i| value(r, i) as f32 * 0.25);
        check_all_ops::<f16>(n, len, |r, i| f16::from_f32(value(r, i) as f32 / 8.0));
    }
}

#[test]
fn average_divides_the_sum_by_the_rank_count() {
    let results = on_ranks(3, |comm| {
        let mut ints = vec![comm.rank() as i32 + 1; 5];
        comm.allreduce(&mut ints, ReduceOp::Average, Scale::NONE)?;
        let mut floats = vec![comm.rank() as f64; 50_000];
        comm.allreduce(&mut floats, ReduceOp::Average, Scale::NONE)?;
        Ok((ints, floats))
    });
    for (ints, floats) in results {
        assert_eq!(ints, [2; 5]);
        assert!(floats.iter().all(|&x| x == 1.0));
    }
}

#[test]
fn many_small_allreduces_on_8_ranks_stay_in_step() {
    let results = on_ranks(8, |comm| {
        let mut sums = Vec::new();
        for round in 0..150 {
            let mut buf = [comm.rank() as i64 * round, 1];
            comm.allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)?;
            sums.push(buf);
        }
        Ok(sums)
    });
    for sums in results {
        for (round, buf) in sums.iter().enumerate() {
            assert_eq!(*buf, [28 * round as i64, 8]);
        }
    }
}

#[test]
fn allgatherv_concatenates_uneven_blocks() {
    for n in 1..=5 {
        let counts: Vec<usize> = (0..n).map(|r| (r * 3) % 4).collect();
        let total: usize = counts.iter().sum();
        let results = on_ranks(n, |comm| {
            let send: Vec<i32> = (0..counts[comm.rank()])
                .map(|i| value(comm.rank(), i))
                .collect();
            let mut recv = vec![0; total];
            comm.allgatherv(&send, &mut recv, &counts)?;
            Ok(recv)
        });
        let expected: Vec<i32> = (0..n)
            .flat_map(|r| (0..counts[r]).map(move |i| value(r, i)))
            .collect();
        assert!(results.iter().all(|got| got == &expected), "{n} ranks");
    }
}

#[test]
fn broadcast_copies_the_root_buffer() {
    for n in 1..=4 {
        let root = n - 1;
        let results = on_ranks(n, |comm| {
            let mut buf: Vec<u16> = vec![comm.rank() as u16; 1000];
            comm.broadcast(&mut buf, root)?;
            Ok(buf)
        });
        assert!(results.iter().all(|got| got == &vec![root as u16; 1000]));
    }
}

#[test]
fn reduce_scatter_leaves_each_rank_its_block() {
    for n in 1..=5 {
        let counts: Vec<usize> = (0..n).map(|r| 2 + r * 5).collect();
        let total: usize = counts.iter().sum();
        let scale = Scale {
            prescale: 2.0,
            postscale: 1.0,
        };
        let results = on_ranks(n, |comm| {
            let send: Vec<i32> = (0..total).map(|i| value(comm.rank(), i)).collect();
            let mut recv = vec![0; counts[comm.rank()]];
            comm.reduce_scatter(&send, &mut recv, &counts, ReduceOp::Sum, scale)?;
            Ok(recv)
        });
        let mut start = 0;
        for (rank, got) in results.iter().enumerate() {
            let expected: Vec<i32> = (start..start + counts[rank])
                .map(|i| (0..n).map(|r| 2 * value(r, i)).sum())
                .collect();
            assert_eq!(got, &expected, "{n} ranks, rank {rank}");
            start += counts[rank];
        }
    }
}

#[test]
fn alltoallv_delivers_every_block_to_its_rank() {
    // Rank s sends (s + d) % 3 elements to rank d, valued 100 * s + d.
    let n = 4;
    let count = |s: usize, d: usize| (s + d) % 3;
    let results = on_ranks(n, |comm| {
        let me = comm.rank();
        let send_counts: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
        let send: Vec<i64> = (0..n)
            .flat_map(|d| std::iter::repeat_n((100 * me + d) as i64, count(me, d)))
            .collect();
        let mut recv = vec![-1i64; recv_counts.iter().sum()];
        comm.alltoallv(&send, &send_counts, &mut recv, &recv_counts)?;
        Ok(recv)
    });
    for (me, got) in results.iter().enumerate() {
        let expected: Vec<i64> = (0..n)
            .flat_map(|s| std::iter::repeat_n((100 * s + me) as i64, count(s, me)))
            .collect();
        assert_eq!(got, &expected, "rank {me}");
    }
}

#[test]
fn send_recv_keeps_order_per_peer_and_tag() {
    let results = on_ranks(3, |comm| {
        let me = comm.rank();
        for dst in (0..3).filter(|&d| d != me) {
            for i in 0..50 {
                comm.send(&[me as i32, i], dst, (i % 2) as u32)?;
            }
        }
        let mut got = Vec::new();
        for src in (0..3).filter(|&s| s != me) {
            for tag in [1u32, 0] {
                for _ in 0..25 {
                    let mut buf = [0i32; 2];
                    comm.recv(&mut buf, src, tag)?;
                    got.push(buf);
                }
            }
        }
        Ok(got)
    });
    for (me, got) in results.iter().enumerate() {
        let expected: Vec<[i32; 2]> = (0..3)
            .filter(|&s| s != me)
            .flat_map(|s| {
                [1, 0].into_iter().flat_map(move |tag| {
                    (0..50)
                        .filter(move |i| i % 2 == tag)
                        .map(move |i| [s as i32, i])
                })
            })
            .collect();
        assert_eq!(got, &expected, "rank {me}");
    }
}

#[test]
fn sendrecv_ring_and_transactions_do_not_deadlock() {
    let results = on_ranks(4, |comm| {
        let (me, n) = (comm.rank(), comm.size());
        let mut from_left = [0u8; 3];
        comm.sendrecv(
            &[me as u8; 3],
            (me + 1) % n,
            &mut from_left,
            (me + n - 1) % n,
            5,
        )?;

        let send: Vec<f32> = (0..8).map(|i| (me * 8 + i) as f32).collect();
        let mut block = [0f32; 2];
        let mut gathered = [0f32; 8];
        let mut ring = [0f32; 1];
        let mut tx = Transaction::new();
        tx.reduce_scatter(&send, &mut block, ReduceOp::Sum, Scale::NONE)
            .recv(&mut ring, (me + n - 1) % n, 7)
            .send(&send[..1], (me + 1) % n, 7);
        comm.execute(tx)?;
        let mut tx = Transaction::new();
        tx.all_gather(&block, &mut gathered);
        comm.execute(tx)?;
        Ok((from_left, gathered, ring))
    });
    let sums: Vec<f32> = (0..8)
        .map(|i| (0..4).map(|r| (r * 8 + i) as f32).sum())
        .collect();
    for (me, (from_left, gathered, ring)) in results.into_iter().enumerate() {
        let left = (me + 3) % 4;
        assert_eq!(from_left, [left as u8; 3]);
        assert_eq!(gathered.to_vec(), sums);
        assert_eq!(ring, [(left * 8) as f32]);
    }
}
