//! Dissemination barrier: in round k every rank signals `rank + 2^k` and
//! waits for `rank - 2^k`; after `ceil(log2 n)` rounds every rank has
//! (transitively) heard from every other.

use super::BARRIER_TAG;
use crate::error::Result;
use crate::traits::Collectives;

/// Returns once every rank has entered.
pub fn dissemination_barrier<C: Collectives + ?Sized>(comm: &mut C) -> Result<()> {
    let (n, rank) = (comm.size(), comm.rank());
    let mut distance = 1;
    while distance < n {
        let (to, from) = ((rank + distance) % n, (rank + n - distance) % n);
        comm.sendrecv::<u8>(&[], to, &mut [], from, BARRIER_TAG)?;
        distance *= 2;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The schedule alone: after the rounds, every rank has heard from
    /// every other rank (directly or through a chain).
    #[test]
    fn every_rank_hears_from_every_other() {
        for n in 1usize..=70 {
            let mut heard: Vec<Vec<bool>> =
                (0..n).map(|r| (0..n).map(|p| p == r).collect()).collect();
            let mut distance = 1;
            while distance < n {
                let before = heard.clone();
                for (rank, row) in heard.iter_mut().enumerate() {
                    let from = (rank + n - distance) % n;
                    for (p, h) in row.iter_mut().enumerate() {
                        *h |= before[from][p];
                    }
                }
                distance *= 2;
            }
            assert!(heard.iter().all(|row| row.iter().all(|&h| h)), "n = {n}");
        }
    }
}
