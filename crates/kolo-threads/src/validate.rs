//! The verdict on a round: do the calls of all ranks fit together?
//!
//! Every rank runs [`check`] over the same published arguments, so every
//! rank reaches the same verdict: a mismatch is an error on every rank
//! (Horovod's rule), and no rank touches a peer's buffer before the verdict
//! says the lengths agree.

use crate::call::{Kind, PeerArgs};

/// `Err(message)` if the calls of the ranks (in rank order) do not fit
/// together; the message names the collective, the ranks and the values.
pub(crate) fn check(args: &[PeerArgs<'_>]) -> Result<(), String> {
    let Some(first) = args.first() else {
        return Ok(());
    };
    let kind = first.call.kind;
    if let Some((rank, other)) = args.iter().enumerate().find(|(_, a)| a.call.kind != kind) {
        return Err(format!(
            "collective mismatch: rank {rank} called {} while rank 0 called {}",
            other.call.kind.name(),
            kind.name()
        ));
    }
    same_call(args)
        .and_then(|()| match kind {
            Kind::Allreduce | Kind::BitwiseAllreduce => equal_send_lens(args),
            Kind::AllreduceSegments => same_segments(args),
            Kind::Broadcast => broadcast(args),
            Kind::Allgatherv => allgatherv(args),
            Kind::ReduceScatter => reduce_scatter(args),
            Kind::Alltoallv => alltoallv(args),
            Kind::Barrier
            | Kind::ControlBarrier
            | Kind::GatherBytes
            | Kind::BroadcastBytes
            | Kind::AllgatherBytes => Ok(()),
        })
        .map_err(|message| format!("{}: {message}", kind.name()))
}

/// Element type, operation, root and scale agree, and the root is a rank.
fn same_call(args: &[PeerArgs<'_>]) -> Result<(), String> {
    let first = &args[0].call;
    for (rank, a) in args.iter().enumerate().skip(1) {
        let call = &a.call;
        if call.elem != first.elem {
            return Err(match (call.elem, first.elem) {
                (Some(e), Some(f)) if e.dtype != f.dtype => format!(
                    "rank {rank} passed {} elements while rank 0 passed {}",
                    e.dtype, f.dtype
                ),
                (Some(e), _) => format!(
                    "rank {rank} passed a different Rust element type than rank 0 under the name {}",
                    e.dtype
                ),
                (None, _) => format!("rank {rank} passed no element type while rank 0 did"),
            });
        }
        if call.op != first.op {
            return Err(format!(
                "rank {rank} asked for {} while rank 0 asked for {}",
                call.op.name(),
                first.op.name()
            ));
        }
        if call.root != first.root {
            return Err(format!(
                "rank {rank} named root {} while rank 0 named root {}",
                show_root(call.root),
                show_root(first.root)
            ));
        }
        let (s, f) = (call.scale, first.scale);
        if s.prescale.to_bits() != f.prescale.to_bits()
            || s.postscale.to_bits() != f.postscale.to_bits()
        {
            return Err(format!(
                "rank {rank} scales by (prescale {}, postscale {}) while rank 0 scales by (prescale {}, postscale {})",
                s.prescale, s.postscale, f.prescale, f.postscale
            ));
        }
    }
    match first.root {
        Some(root) if root >= args.len() => Err(format!(
            "root {root} is not a rank of this {}-rank communicator",
            args.len()
        )),
        _ => Ok(()),
    }
}

fn show_root(root: Option<usize>) -> String {
    root.map_or_else(|| "none".to_string(), |r| r.to_string())
}

fn equal_send_lens(args: &[PeerArgs<'_>]) -> Result<(), String> {
    let len = args[0].send_len;
    match args.iter().enumerate().find(|(_, a)| a.send_len != len) {
        Some((rank, a)) => Err(format!(
            "rank {rank} passed {} elements but rank 0 passed {len}",
            a.send_len
        )),
        None => Ok(()),
    }
}

/// Every rank published as many segments as rank 0, each as long as rank
/// 0's.
fn same_segments(args: &[PeerArgs<'_>]) -> Result<(), String> {
    let first = args[0].segments;
    for (rank, a) in args.iter().enumerate().skip(1) {
        if a.segments.len() != first.len() {
            return Err(format!(
                "rank {rank} passed {} segments but rank 0 passed {}",
                a.segments.len(),
                first.len()
            ));
        }
        let differing = a
            .segments
            .iter()
            .zip(first)
            .position(|(s, f)| s.len() != f.len());
        if let Some(i) = differing {
            return Err(format!(
                "rank {rank}'s segment {i} holds {} elements but rank 0's holds {}",
                a.segments[i].len(),
                first[i].len()
            ));
        }
    }
    Ok(())
}

fn broadcast(args: &[PeerArgs<'_>]) -> Result<(), String> {
    let root = args[0].call.root.unwrap_or(0);
    let len = args[root].send_len;
    match args.iter().enumerate().find(|(_, a)| a.send_len != len) {
        Some((rank, a)) => Err(format!(
            "rank {rank}'s buffer holds {} elements but the root's (rank {root}) holds {len}",
            a.send_len
        )),
        None => Ok(()),
    }
}

/// Every rank passed `n` counts, and the same ones; returns them with their
/// total. `pick` selects the count array, `what` names it.
fn same_counts<'a>(
    args: &[PeerArgs<'a>],
    pick: impl Fn(&PeerArgs<'a>) -> &'a [usize],
    what: &str,
) -> Result<(&'a [usize], usize), String> {
    let n = args.len();
    for (rank, a) in args.iter().enumerate() {
        if pick(a).len() != n {
            return Err(format!(
                "rank {rank} passed {} {what} for a {n}-rank communicator",
                pick(a).len()
            ));
        }
    }
    let counts = pick(&args[0]);
    for (rank, a) in args.iter().enumerate().skip(1) {
        if let Some(i) = (0..n).find(|&i| pick(a)[i] != counts[i]) {
            return Err(format!(
                "rank {rank}'s {what}[{i}] is {} but rank 0's is {}",
                pick(a)[i],
                counts[i]
            ));
        }
    }
    Ok((counts, total(counts, what)?))
}

fn total(counts: &[usize], what: &str) -> Result<usize, String> {
    counts
        .iter()
        .try_fold(0usize, |sum, &c| sum.checked_add(c))
        .ok_or_else(|| format!("the {what} overflow usize"))
}

fn allgatherv(args: &[PeerArgs<'_>]) -> Result<(), String> {
    let (counts, total) = same_counts(args, |a| a.counts, "counts")?;
    for (rank, a) in args.iter().enumerate() {
        if a.send_len != counts[rank] {
            return Err(format!(
                "rank {rank} sends {} elements but counts[{rank}] is {}",
                a.send_len, counts[rank]
            ));
        }
        if a.recv_len != total {
            return Err(format!(
                "rank {rank}'s receive buffer holds {} elements but the counts add up to {total}",
                a.recv_len
            ));
        }
    }
    Ok(())
}

fn reduce_scatter(args: &[PeerArgs<'_>]) -> Result<(), String> {
    let (counts, total) = same_counts(args, |a| a.counts, "counts")?;
    for (rank, a) in args.iter().enumerate() {
        if a.send_len != total {
            return Err(format!(
                "rank {rank}'s send buffer holds {} elements but the counts add up to {total}",
                a.send_len
            ));
        }
        if a.recv_len != counts[rank] {
            return Err(format!(
                "rank {rank}'s receive buffer holds {} elements but counts[{rank}] is {}",
                a.recv_len, counts[rank]
            ));
        }
    }
    Ok(())
}

fn alltoallv(args: &[PeerArgs<'_>]) -> Result<(), String> {
    let n = args.len();
    for (rank, a) in args.iter().enumerate() {
        for (counts, what, len) in [
            (a.counts, "send_counts", a.send_len),
            (a.recv_counts, "recv_counts", a.recv_len),
        ] {
            if counts.len() != n {
                return Err(format!(
                    "rank {rank} passed {} {what} for a {n}-rank communicator",
                    counts.len()
                ));
            }
            let sum = total(counts, what)?;
            if sum != len {
                return Err(format!(
                    "rank {rank}'s {what} add up to {sum} but its buffer holds {len} elements"
                ));
            }
        }
    }
    for (src, a) in args.iter().enumerate() {
        for (dst, b) in args.iter().enumerate() {
            if a.counts[dst] != b.recv_counts[src] {
                return Err(format!(
                    "rank {src} sends {} elements to rank {dst} but rank {dst} expects {} from rank {src}",
                    a.counts[dst], b.recv_counts[src]
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::Call;
    use crate::shared::Segment;
    use kolo_protocol::ReduceOp;
    use kolo_transport::Scale;
    use proptest::prelude::*;

    fn data(kind: Kind, send_len: usize, recv_len: usize) -> PeerArgs<'static> {
        PeerArgs {
            send_len,
            recv_len,
            ..PeerArgs::bare(Call::of::<f32>(kind))
        }
    }

    #[test]
    fn kind_type_op_root_and_scale_must_agree() {
        let ar = PeerArgs::bare(Call::reduce::<f32>(
            Kind::Allreduce,
            ReduceOp::Sum,
            Scale::NONE,
        ));
        assert_eq!(check(&[ar, ar]), Ok(()));
        let bc = PeerArgs::bare(Call::of::<f32>(Kind::Broadcast).rooted(0));
        let err = check(&[ar, bc]).unwrap_err();
        assert_eq!(
            err,
            "collective mismatch: rank 1 called broadcast while rank 0 called allreduce"
        );

        let int = PeerArgs::bare(Call::reduce::<i32>(
            Kind::Allreduce,
            ReduceOp::Sum,
            Scale::NONE,
        ));
        let err = check(&[ar, int]).unwrap_err();
        assert!(
            err.contains("rank 1 passed i32 elements while rank 0 passed f32"),
            "{err}"
        );

        let max = PeerArgs::bare(Call::reduce::<f32>(
            Kind::Allreduce,
            ReduceOp::Max,
            Scale::NONE,
        ));
        assert!(check(&[ar, max])
            .unwrap_err()
            .contains("max while rank 0 asked for sum"));

        let scaled = Scale {
            prescale: 2.0,
            postscale: 1.0,
        };
        let sc = PeerArgs::bare(Call::reduce::<f32>(Kind::Allreduce, ReduceOp::Sum, scaled));
        assert!(check(&[ar, sc]).unwrap_err().contains("prescale 2"));

        let bc1 = PeerArgs::bare(Call::of::<f32>(Kind::Broadcast).rooted(1));
        assert!(check(&[bc, bc1])
            .unwrap_err()
            .contains("rank 1 named root 1 while rank 0 named root 0"));
        let bc5 = PeerArgs::bare(Call::of::<f32>(Kind::Broadcast).rooted(5));
        assert!(check(&[bc5, bc5])
            .unwrap_err()
            .contains("root 5 is not a rank"));
    }

    #[test]
    fn allreduce_and_broadcast_lengths_must_agree() {
        let err = check(&[data(Kind::Allreduce, 4, 0), data(Kind::Allreduce, 5, 0)]).unwrap_err();
        assert_eq!(
            err,
            "allreduce: rank 1 passed 5 elements but rank 0 passed 4"
        );
        let bcast = |len| PeerArgs {
            send_len: len,
            ..PeerArgs::bare(Call::of::<f32>(Kind::Broadcast).rooted(1))
        };
        let err = check(&[bcast(3), bcast(2)]).unwrap_err();
        assert!(
            err.contains("rank 0's buffer holds 3 elements but the root's (rank 1) holds 2"),
            "{err}"
        );
    }

    fn segments(call: Call, table: &[Segment]) -> PeerArgs<'_> {
        PeerArgs {
            segments: table,
            ..PeerArgs::bare(call)
        }
    }

    #[test]
    fn segment_counts_and_lengths_must_agree() {
        let table = |lens: &[usize]| -> Vec<Segment> {
            lens.iter().map(|&len| Segment::len_only(len)).collect()
        };
        let sum = Call::reduce::<f32>(Kind::AllreduceSegments, ReduceOp::Sum, Scale::NONE);
        let (a, b, c) = (table(&[4, 0, 7]), table(&[4, 0]), table(&[4, 1, 7]));
        let seg = |t| segments(sum, t);
        assert_eq!(check(&[seg(&a), seg(&a), seg(&a)]), Ok(()));
        assert_eq!(check(&[seg(&[]), seg(&[])]), Ok(()));
        assert_eq!(
            check(&[seg(&a), seg(&a), seg(&b)]).unwrap_err(),
            "allreduce_segments: rank 2 passed 2 segments but rank 0 passed 3"
        );
        assert_eq!(
            check(&[seg(&a), seg(&c)]).unwrap_err(),
            "allreduce_segments: rank 1's segment 1 holds 1 elements but rank 0's holds 0"
        );
        let max = Call::reduce::<f32>(Kind::AllreduceSegments, ReduceOp::Max, Scale::NONE);
        assert!(check(&[seg(&a), segments(max, &a)])
            .unwrap_err()
            .contains("rank 1 asked for max while rank 0 asked for sum"));
        let ar = PeerArgs::bare(Call::reduce::<f32>(
            Kind::Allreduce,
            ReduceOp::Sum,
            Scale::NONE,
        ));
        assert_eq!(
            check(&[seg(&a), ar]).unwrap_err(),
            "collective mismatch: rank 1 called allreduce while rank 0 called allreduce_segments"
        );
    }

    fn gatherv_args<'a>(
        counts: &'a [Vec<usize>],
        sends: &[usize],
        recvs: &[usize],
    ) -> Vec<PeerArgs<'a>> {
        counts
            .iter()
            .zip(sends.iter().zip(recvs))
            .map(|(c, (&s, &r))| PeerArgs {
                counts: c,
                ..data(Kind::Allgatherv, s, r)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn allgatherv_accepts_consistent_and_rejects_any_change(
            counts in prop::collection::vec(0usize..50, 1..9),
            victim in any::<prop::sample::Index>(),
            field in 0usize..3,
        ) {
            let n = counts.len();
            let total: usize = counts.iter().sum();
            let all = vec![counts.clone(); n];
            let sends = counts.clone();
            let recvs = vec![total; n];
            prop_assert_eq!(check(&gatherv_args(&all, &sends, &recvs)), Ok(()));

            let v = victim.index(n);
            let (mut all, mut sends, mut recvs) = (all, sends, recvs);
            match field {
                0 => all[v][victim.index(n)] += 1,
                1 => sends[v] += 1,
                _ => recvs[v] += 1,
            }
            prop_assert!(check(&gatherv_args(&all, &sends, &recvs)).is_err());
        }

        #[test]
        fn alltoallv_matches_every_pair(
            matrix in prop::collection::vec(prop::collection::vec(0usize..20, 4), 4),
            src in 0usize..4,
            dst in 0usize..4,
        ) {
            // matrix[s][d]: elements rank s sends to rank d.
            let recv_counts: Vec<Vec<usize>> =
                (0..4).map(|d| (0..4).map(|s| matrix[s][d]).collect()).collect();
            let build = |send: &'_ [Vec<usize>], recv: &'_ [Vec<usize>]| -> Vec<(usize, usize)> {
                send.iter().zip(recv).map(|(s, r)| (s.iter().sum(), r.iter().sum())).collect()
            };
            let lens = build(&matrix, &recv_counts);
            let args: Vec<PeerArgs<'_>> = (0..4)
                .map(|r| PeerArgs {
                    counts: &matrix[r],
                    recv_counts: &recv_counts[r],
                    ..data(Kind::Alltoallv, lens[r].0, lens[r].1)
                })
                .collect();
            prop_assert_eq!(check(&args), Ok(()));

            let mut skewed = matrix.clone();
            skewed[src][dst] += 1;
            let lens = build(&skewed, &recv_counts);
            let args: Vec<PeerArgs<'_>> = (0..4)
                .map(|r| PeerArgs {
                    counts: &skewed[r],
                    recv_counts: &recv_counts[r],
                    ..data(Kind::Alltoallv, lens[r].0, lens[r].1)
                })
                .collect();
            let err = check(&args).unwrap_err();
            let expected = format!("rank {src} sends");
            prop_assert!(err.contains(&expected), "{}", err);
        }

        #[test]
        fn reduce_scatter_checks_send_and_block(counts in prop::collection::vec(0usize..30, 1..7), bump in 0usize..2) {
            let n = counts.len();
            let total: usize = counts.iter().sum();
            let args: Vec<PeerArgs<'_>> = (0..n)
                .map(|r| PeerArgs { counts: &counts, ..data(Kind::ReduceScatter, total, counts[r]) })
                .collect();
            prop_assert_eq!(check(&args), Ok(()));
            let mut bad = args.clone();
            if bump == 0 { bad[n - 1].send_len += 1 } else { bad[0].recv_len += 1 }
            prop_assert!(check(&bad).is_err());
        }
    }

    #[test]
    fn count_arrays_must_have_one_entry_per_rank() {
        let short = [1usize];
        let args = [
            PeerArgs {
                counts: &short,
                ..data(Kind::Allgatherv, 1, 1)
            },
            PeerArgs {
                counts: &short,
                ..data(Kind::Allgatherv, 1, 1)
            },
        ];
        assert!(check(&args)
            .unwrap_err()
            .contains("rank 0 passed 1 counts for a 2-rank communicator"));
        let huge = [usize::MAX, 1];
        let args = [
            PeerArgs {
                counts: &huge,
                ..data(Kind::Allgatherv, 1, 1)
            },
            PeerArgs {
                counts: &huge,
                ..data(Kind::Allgatherv, 1, 1)
            },
        ];
        assert!(check(&args).unwrap_err().contains("overflow"));
    }
}
