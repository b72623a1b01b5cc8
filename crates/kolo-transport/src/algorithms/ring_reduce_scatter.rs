//! Ring reduce-scatter: `n - 1` steps; at each, every rank passes one
//! partially reduced block to its right neighbour and folds the block
//! arriving from its left into its own copy. After the last step block
//! `rank` holds every rank's contribution.

use super::blocks::{check_len, ring_index, Blocks};
use super::scratch::with_scratch;
use super::REDUCE_SCATTER_TAG;
use crate::element::Element;
use crate::error::Result;
use crate::traits::{Collectives, Scale};
use kolo_protocol::ReduceOp;
use std::ops::Range;

/// The blocks rank `rank` sends and receives at `step` (0-based): it sends
/// `rank - step - 1` and receives `rank - step - 2` (mod n), so that the last
/// step (`n - 2`) delivers block `rank` itself.
pub(crate) fn reduce_scatter_step(rank: usize, step: usize, n: usize) -> (usize, usize) {
    (ring_index(rank, step + 1, n), ring_index(rank, step + 2, n))
}

/// Bytes per message of a reduce-scatter step: a step's block goes as
/// segments of this size, each folded in as soon as it arrives, so the
/// incoming segment is still in the cache (a per-core L2) when it is
/// reduced instead of being written to memory and read back.
pub(crate) const SEGMENT_BYTES: usize = 256 << 10;

/// Segment `i` of `block`, `segment` elements long (the last one shorter;
/// empty past the end).
fn segment_of(block: Range<usize>, i: usize, segment: usize) -> Range<usize> {
    let start = (block.start + i * segment).min(block.end);
    start..(start + segment).min(block.end)
}

/// Ring reduce-scatter over `buf`, which holds this rank's (already
/// prescaled) contribution cut into `blocks`. Afterwards block `rank` of
/// `buf` is the reduction over every rank; the other blocks hold partial
/// results. Every step sends as many segments as the longest block has,
/// on every rank, so sender and receiver pair up even where blocks differ
/// in length (the shorter ones send empty segments at the end).
pub(crate) fn reduce_scatter_in_place<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    buf: &mut [T],
    blocks: &Blocks,
    op: ReduceOp,
    tag: u32,
) -> Result<()> {
    let (n, rank) = (comm.size(), comm.rank());
    if n <= 1 {
        return Ok(());
    }
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let segment = (SEGMENT_BYTES / std::mem::size_of::<T>().max(1)).max(1);
    let segments = blocks.max_len().div_ceil(segment).max(1);
    with_scratch(blocks.max_len().min(segment), |incoming: &mut [T]| {
        for step in 0..n - 1 {
            let (send_block, recv_block) = reduce_scatter_step(rank, step, n);
            for i in 0..segments {
                let out = segment_of(blocks.range(send_block), i, segment);
                let into = segment_of(blocks.range(recv_block), i, segment);
                let incoming = &mut incoming[..into.len()];
                comm.sendrecv(&buf[out], right, incoming, left, tag)?;
                T::reduce_into(&mut buf[into], incoming, op);
            }
        }
        Ok(())
    })
}

/// Reduces every rank's `send` (`sum(counts)` elements, cut into one block
/// per rank) and leaves block `rank` in `recv` (`counts[rank]` elements):
/// `recv = postscale' * op_r(prescale * block_r)` where `postscale'` is
/// [`Scale::postscale_for`] (`Average` is `Sum` then `1 / n`).
pub fn ring_reduce_scatter<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    send: &[T],
    recv: &mut [T],
    counts: &[usize],
    op: ReduceOp,
    scale: Scale,
) -> Result<()> {
    const OP: &str = "reduce_scatter";
    let (n, rank) = (comm.size(), comm.rank());
    let blocks = Blocks::from_counts(OP, "counts", counts, n)?;
    check_len(OP, "send", send.len(), blocks.total())?;
    check_len(OP, "recv", recv.len(), blocks.range(rank).len())?;

    let mut work = send.to_vec();
    T::scale(&mut work, scale.prescale);
    reduce_scatter_in_place(comm, &mut work, &blocks, op, REDUCE_SCATTER_TAG)?;
    recv.copy_from_slice(&work[blocks.range(rank)]);
    T::scale(recv, scale.postscale_for(op, n));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs the schedule on sets of contributors (bit r = rank r) instead of
    /// data: every received block must be the one the left neighbour sent,
    /// and each rank must end with every contribution in its own block.
    fn simulate(n: usize) -> Result<(), TestCaseError> {
        let mut state: Vec<Vec<u64>> = (0..n).map(|r| vec![1u64 << r; n]).collect();
        for step in 0..n.saturating_sub(1) {
            let sent: Vec<(usize, u64)> = (0..n)
                .map(|r| {
                    let (block, _) = reduce_scatter_step(r, step, n);
                    (block, state[r][block])
                })
                .collect();
            for r in 0..n {
                let (_, recv_block) = reduce_scatter_step(r, step, n);
                let (block, contributors) = sent[(r + n - 1) % n];
                prop_assert_eq!(block, recv_block);
                prop_assert_eq!(
                    state[r][block] & contributors,
                    0,
                    "a contribution counted twice"
                );
                state[r][block] |= contributors;
            }
        }
        let everyone = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        for (r, blocks) in state.iter().enumerate() {
            prop_assert_eq!(blocks[r], everyone, "rank {} misses contributions", r);
        }
        Ok(())
    }

    proptest! {
        /// The segments of a block tile it in order, none longer than asked.
        #[test]
        fn segments_tile_their_block(start in 0usize..1000, len in 0usize..5000, segment in 1usize..700) {
            let block = start..start + len;
            let count = len.div_ceil(segment).max(1);
            let mut next = block.start;
            for i in 0..count + 2 {
                let part = segment_of(block.clone(), i, segment);
                prop_assert_eq!(part.start, next);
                prop_assert!(part.len() <= segment);
                next = part.end;
                if i >= count {
                    prop_assert!(part.is_empty());
                }
            }
            prop_assert_eq!(next, block.end);
        }

        #[test]
        fn schedule_reduces_every_block_once(n in 1usize..=64) {
            simulate(n)?;
        }
    }
}
