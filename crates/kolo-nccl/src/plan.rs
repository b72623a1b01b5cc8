//! Pure planning of the operations NCCL has no single call for: offsets of
//! variable counts, the grouped send/recv of alltoallv, the steps of the
//! destructive all-to-all, and chunking of staged copies. Every argument
//! error names the values.

use crate::error::NcclError;
use std::ops::Range;

fn invalid(msg: String) -> NcclError {
    NcclError::InvalidArgument(msg)
}

/// Prefix sums of `counts` (`offsets[r]` = elements before block r) and
/// the total; an overflowing sum is an error.
pub fn offsets(counts: &[usize]) -> Result<(Vec<usize>, usize), NcclError> {
    let mut offsets = Vec::with_capacity(counts.len());
    let mut total = 0usize;
    for &c in counts {
        offsets.push(total);
        total = total
            .checked_add(c)
            .ok_or_else(|| invalid(format!("counts {counts:?} overflow usize")))?;
    }
    Ok((offsets, total))
}

fn check_counts(
    what: &str,
    counts: &[usize],
    size: usize,
) -> Result<(Vec<usize>, usize), NcclError> {
    if counts.len() != size {
        return Err(invalid(format!(
            "{what}: {} counts given for {size} ranks",
            counts.len()
        )));
    }
    offsets(counts)
}

/// Validates an allgatherv on `rank` of `size` and returns the offsets.
pub fn allgatherv(
    rank: usize,
    size: usize,
    send_len: usize,
    recv_len: usize,
    counts: &[usize],
) -> Result<Vec<usize>, NcclError> {
    let (offsets, total) = check_counts("allgatherv", counts, size)?;
    if send_len != counts[rank] {
        return Err(invalid(format!(
            "allgatherv: rank {rank} sends {send_len} elements but counts[{rank}] is {}",
            counts[rank]
        )));
    }
    if recv_len != total {
        return Err(invalid(format!(
            "allgatherv: recv holds {recv_len} elements but the counts sum to {total}"
        )));
    }
    Ok(offsets)
}

/// Validates a reduce-scatter on `rank` of `size` and returns the offsets.
pub fn reduce_scatter(
    rank: usize,
    size: usize,
    send_len: usize,
    recv_len: usize,
    counts: &[usize],
) -> Result<Vec<usize>, NcclError> {
    let (offsets, total) = check_counts("reduce_scatter", counts, size)?;
    if send_len != total {
        return Err(invalid(format!(
            "reduce_scatter: send holds {send_len} elements but the counts sum to {total}"
        )));
    }
    if recv_len != counts[rank] {
        return Err(invalid(format!(
            "reduce_scatter: rank {rank} receives {recv_len} elements but counts[{rank}] is {}",
            counts[rank]
        )));
    }
    Ok(offsets)
}

/// `Some(c)` when all counts equal `c` (NCCL's native even collectives).
pub fn even(counts: &[usize]) -> Option<usize> {
    let first = *counts.first()?;
    counts.iter().all(|&c| c == first).then_some(first)
}

/// Checks that `size` blocks of `part` elements make exactly `whole` (the
/// even operations of transactions: in-place buffers split into one block
/// per rank, all-gather and reduce-scatter pairs).
pub fn even_blocks(what: &str, size: usize, whole: usize, part: usize) -> Result<(), NcclError> {
    if part.checked_mul(size) != Some(whole) {
        return Err(invalid(format!(
            "{what}: {size} blocks of {part} elements do not make the {whole} elements given"
        )));
    }
    Ok(())
}

/// One peer's part of an alltoallv: what to send it and where its data lands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// The peer.
    pub peer: usize,
    /// Elements of `send` for the peer (empty: nothing sent).
    pub send: Range<usize>,
    /// Elements of `recv` the peer fills (empty: nothing received).
    pub recv: Range<usize>,
}

/// Plans an alltoallv on `rank` of `size`: one [`Exchange`] per peer in
/// peer order, this rank's own block included (copied locally, so its two
/// counts must agree).
pub fn alltoallv(
    rank: usize,
    size: usize,
    send_len: usize,
    send_counts: &[usize],
    recv_len: usize,
    recv_counts: &[usize],
) -> Result<Vec<Exchange>, NcclError> {
    let (send_off, send_total) = check_counts("alltoallv send_counts", send_counts, size)?;
    let (recv_off, recv_total) = check_counts("alltoallv recv_counts", recv_counts, size)?;
    if send_total != send_len {
        return Err(invalid(format!(
            "alltoallv: send holds {send_len} elements but send_counts sum to {send_total}"
        )));
    }
    if recv_total != recv_len {
        return Err(invalid(format!(
            "alltoallv: recv holds {recv_len} elements but recv_counts sum to {recv_total}"
        )));
    }
    if send_counts[rank] != recv_counts[rank] {
        return Err(invalid(format!(
            "alltoallv: rank {rank} sends itself {} elements but expects {}",
            send_counts[rank], recv_counts[rank]
        )));
    }
    Ok((0..size)
        .map(|peer| Exchange {
            peer,
            send: send_off[peer]..send_off[peer] + send_counts[peer],
            recv: recv_off[peer]..recv_off[peer] + recv_counts[peer],
        })
        .collect())
}

/// One step of the destructive all-to-all: send block `send_slot` to `dst`
/// and receive `src`'s block into `recv_slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// Block sent.
    pub send_slot: usize,
    /// Its destination.
    pub dst: usize,
    /// Block overwritten by the received data.
    pub recv_slot: usize,
    /// The sender.
    pub src: usize,
}

/// LLMQ's destructive all-to-all on `rank` of `size`: the buffer holds
/// `size` blocks, block p destined for rank p. Step n (1..size) sends block
/// `rank + n` to rank `rank + n` and receives rank `rank - n`'s block into
/// slot `rank + n - 1`, which was sent in step n-1 (or is this rank's own
/// block, which is not preserved). The steps run in order (one NCCL group
/// each), so a slot is overwritten only after it was sent. The block from
/// rank s ends up in slot [`destructive_slot`]`(rank, s, size)`.
pub fn destructive_all_to_all(rank: usize, size: usize) -> Vec<Step> {
    (1..size)
        .map(|n| Step {
            send_slot: (rank + n) % size,
            dst: (rank + n) % size,
            recv_slot: (rank + n - 1) % size,
            src: (rank + size - n) % size,
        })
        .collect()
}

/// Where the destructive all-to-all on `rank` leaves the block received
/// from `src` (`src != rank`): slot `(2 rank - src - 1) mod size`.
pub fn destructive_slot(rank: usize, src: usize, size: usize) -> usize {
    (2 * rank + 2 * size - src - 1) % size
}

/// Splits `len` elements into ranges of at most `max` (at least one
/// element per chunk; an empty input gives no chunk).
pub fn chunks(len: usize, max: usize) -> impl Iterator<Item = Range<usize>> {
    let max = max.max(1);
    (0..len.div_ceil(max)).map(move |i| i * max..((i + 1) * max).min(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn validates_variable_counts() {
        assert_eq!(allgatherv(1, 3, 2, 6, &[1, 2, 3]).unwrap(), vec![0, 1, 3]);
        let e = allgatherv(1, 3, 1, 6, &[1, 2, 3]).unwrap_err();
        assert!(
            e.to_string()
                .contains("rank 1 sends 1 elements but counts[1] is 2"),
            "{e}"
        );
        let e = allgatherv(0, 2, 1, 6, &[1, 2, 3]).unwrap_err();
        assert!(e.to_string().contains("3 counts given for 2 ranks"), "{e}");
        assert_eq!(
            reduce_scatter(2, 3, 6, 3, &[1, 2, 3]).unwrap(),
            vec![0, 1, 3]
        );
        let e = reduce_scatter(0, 3, 5, 1, &[1, 2, 3]).unwrap_err();
        assert!(e.to_string().contains("send holds 5"), "{e}");
        assert!(offsets(&[usize::MAX, 1]).is_err());
        assert_eq!(even(&[4, 4, 4]), Some(4));
        assert_eq!(even(&[4, 3]), None);
        assert_eq!(even(&[]), None);
    }

    #[test]
    fn transaction_blocks_must_tile_the_buffer() {
        assert!(even_blocks("all_gather", 4, 12, 3).is_ok());
        assert!(even_blocks("all_gather", 1, 0, 0).is_ok());
        let e = even_blocks("reduce_scatter", 4, 10, 2).unwrap_err();
        assert!(
            e.to_string()
                .contains("reduce_scatter: 4 blocks of 2 elements do not make the 10"),
            "{e}"
        );
        // An in-place buffer not divisible by the ranks: 10 / 4 = 2 blocks.
        assert!(even_blocks("all_gather", 4, 10, 10 / 4).is_err());
        assert!(even_blocks("x", usize::MAX, 1, 2).is_err());
    }

    #[test]
    fn plans_alltoallv_per_peer() {
        let plan = alltoallv(1, 3, 6, &[1, 2, 3], 5, &[2, 2, 1]).unwrap();
        assert_eq!(
            plan[0],
            Exchange {
                peer: 0,
                send: 0..1,
                recv: 0..2
            }
        );
        assert_eq!(
            plan[1],
            Exchange {
                peer: 1,
                send: 1..3,
                recv: 2..4
            }
        );
        assert_eq!(
            plan[2],
            Exchange {
                peer: 2,
                send: 3..6,
                recv: 4..5
            }
        );
        let e = alltoallv(1, 3, 6, &[1, 2, 3], 5, &[2, 1, 2]).unwrap_err();
        assert!(
            e.to_string()
                .contains("sends itself 2 elements but expects 1"),
            "{e}"
        );
    }

    #[test]
    fn destructive_all_to_all_on_four_ranks() {
        assert_eq!(
            destructive_all_to_all(0, 4),
            vec![
                Step {
                    send_slot: 1,
                    dst: 1,
                    recv_slot: 0,
                    src: 3
                },
                Step {
                    send_slot: 2,
                    dst: 2,
                    recv_slot: 1,
                    src: 2
                },
                Step {
                    send_slot: 3,
                    dst: 3,
                    recv_slot: 2,
                    src: 1
                },
            ]
        );
        assert!(destructive_all_to_all(0, 1).is_empty());
    }

    #[test]
    fn chunks_cover_the_range() {
        assert_eq!(chunks(10, 4).collect::<Vec<_>>(), vec![0..4, 4..8, 8..10]);
        assert_eq!(chunks(0, 4).count(), 0);
        assert_eq!(chunks(3, 0).collect::<Vec<_>>(), vec![0..1, 1..2, 2..3]);
    }

    proptest! {
        /// Simulates every rank's steps in lock step: sends always read a
        /// block not yet overwritten, matched pairs agree, and every block
        /// from every peer lands where `destructive_slot` says.
        #[test]
        fn destructive_all_to_all_delivers_every_block(size in 1usize..9) {
            // buffers[r][slot] = (origin rank, destination rank) of the block.
            let mut buffers: Vec<Vec<(usize, usize)>> = (0..size).map(|r| (0..size).map(|p| (r, p)).collect()).collect();
            let plans: Vec<_> = (0..size).map(|r| destructive_all_to_all(r, size)).collect();
            // steps[k][r]: rank r's step k.
            let steps: Vec<Vec<Step>> = (0..size.saturating_sub(1)).map(|k| plans.iter().map(|p| p[k]).collect()).collect();
            for step in &steps {
                let mut sent = Vec::with_capacity(size);
                for (r, s) in step.iter().enumerate() {
                    let block = buffers[r][s.send_slot];
                    prop_assert_eq!(block, (r, s.dst), "rank {} sends an overwritten block", r);
                    sent.push((s.dst, block));
                }
                for (r, s) in step.iter().enumerate() {
                    let (dst, block) = sent[s.src];
                    prop_assert_eq!(dst, r);
                    buffers[r][s.recv_slot] = block;
                }
            }
            for (r, buffer) in buffers.iter().enumerate() {
                for src in (0..size).filter(|&s| s != r) {
                    prop_assert_eq!(buffer[destructive_slot(r, src, size)], (src, r));
                }
            }
        }

        #[test]
        fn chunks_tile_without_gaps(len in 0usize..10_000, max in 0usize..700) {
            let mut next = 0;
            for c in chunks(len, max) {
                prop_assert_eq!(c.start, next);
                prop_assert!(!c.is_empty() && c.len() <= max.max(1));
                next = c.end;
            }
            prop_assert_eq!(next, len);
        }

        #[test]
        fn alltoallv_ranges_tile_both_buffers(counts in proptest::collection::vec(0usize..50, 1..8), rank_seed in 0usize..100) {
            let size = counts.len();
            let rank = rank_seed % size;
            let recv_counts: Vec<usize> = counts.iter().rev().copied().collect::<Vec<_>>();
            let mut recv_counts = recv_counts;
            recv_counts[rank] = counts[rank];
            let (send_len, recv_len) = (counts.iter().sum(), recv_counts.iter().sum());
            let plan = alltoallv(rank, size, send_len, &counts, recv_len, &recv_counts).unwrap();
            prop_assert_eq!(plan.iter().map(|e| e.send.len()).sum::<usize>(), send_len);
            prop_assert_eq!(plan.iter().map(|e| e.recv.len()).sum::<usize>(), recv_len);
            for w in plan.windows(2) {
                prop_assert_eq!(w[0].send.end, w[1].send.start);
                prop_assert_eq!(w[0].recv.end, w[1].recv.start);
            }
        }
    }
}
