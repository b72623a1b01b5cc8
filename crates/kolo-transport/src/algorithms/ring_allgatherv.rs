//! Ring allgather(v): `n - 1` steps; at each, every rank forwards to its
//! right neighbour the block it received last (its own block first).

use super::blocks::{check_len, ring_index, split_send_recv, Blocks};
use super::ALLGATHER_TAG;
use crate::element::Element;
use crate::error::Result;
use crate::traits::Collectives;

/// The blocks rank `rank` sends and receives at `step`: it sends
/// `rank - step` and receives `rank - step - 1` (mod n).
pub(crate) fn allgather_step(rank: usize, step: usize, n: usize) -> (usize, usize) {
    (ring_index(rank, step, n), ring_index(rank, step + 1, n))
}

/// Ring allgather over `buf`, whose block `rank` holds this rank's data;
/// afterwards every block holds its rank's data.
pub(crate) fn allgather_in_place<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    buf: &mut [T],
    blocks: &Blocks,
    tag: u32,
) -> Result<()> {
    let (n, rank) = (comm.size(), comm.rank());
    if n <= 1 {
        return Ok(());
    }
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    for step in 0..n - 1 {
        let (send_block, recv_block) = allgather_step(rank, step, n);
        let (out, incoming) =
            split_send_recv(buf, blocks.range(send_block), blocks.range(recv_block));
        comm.sendrecv(out, right, incoming, left, tag)?;
    }
    Ok(())
}

/// Concatenates every rank's `send` (`counts[r]` elements from rank r, zeros
/// allowed) in rank order into `recv` (`sum(counts)` elements).
pub fn ring_allgatherv<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    send: &[T],
    recv: &mut [T],
    counts: &[usize],
) -> Result<()> {
    const OP: &str = "allgatherv";
    let (n, rank) = (comm.size(), comm.rank());
    let blocks = Blocks::from_counts(OP, "counts", counts, n)?;
    check_len(OP, "send", send.len(), blocks.range(rank).len())?;
    check_len(OP, "recv", recv.len(), blocks.total())?;

    recv[blocks.range(rank)].copy_from_slice(send);
    allgather_in_place(comm, recv, &blocks, ALLGATHER_TAG)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// On the schedule alone: each rank receives every other rank's
        /// block exactly once, from the left neighbour that already has it.
        #[test]
        fn schedule_delivers_every_block_once(n in 1usize..=64) {
            let mut has: Vec<Vec<bool>> = (0..n).map(|r| (0..n).map(|b| b == r).collect()).collect();
            for step in 0..n.saturating_sub(1) {
                let sent: Vec<usize> = (0..n)
                    .map(|r| allgather_step(r, step, n).0)
                    .collect();
                for r in 0..n {
                    let left = (r + n - 1) % n;
                    prop_assert!(has[left][sent[left]], "rank {} forwards a block it lacks", left);
                    let recv_block = allgather_step(r, step, n).1;
                    prop_assert_eq!(recv_block, sent[left]);
                    prop_assert!(!has[r][recv_block], "block received twice");
                    has[r][recv_block] = true;
                }
            }
            prop_assert!(has.iter().all(|row| row.iter().all(|&h| h)));
        }
    }
}
