//! Binomial-tree broadcast (MPICH's): ranks are renumbered relative to the
//! root; relative rank `v` receives from `v - lowbit(v)` and then sends to
//! `v + 2^k` for every `2^k < lowbit(v)` (the root: every `2^k < n`),
//! largest subtree first. `ceil(log2 n)` rounds.

use super::blocks::check_rank;
use super::BROADCAST_TAG;
use crate::element::Element;
use crate::error::Result;
use crate::traits::Collectives;

/// The relative rank `v` receives from, `None` for the root (`v == 0`).
pub(crate) fn binomial_parent(v: usize) -> Option<usize> {
    (v != 0).then(|| v - (1 << v.trailing_zeros()))
}

/// The relative ranks `v` sends to, largest subtree first.
pub(crate) fn binomial_children(v: usize, n: usize) -> impl Iterator<Item = usize> {
    let limit = if v == 0 {
        n.next_power_of_two()
    } else {
        1 << v.trailing_zeros()
    };
    std::iter::successors(Some(limit / 2), |m| Some(m / 2))
        .take_while(|&m| m >= 1)
        .map(move |m| v + m)
        .filter(move |&child| child < n)
}

/// Copies the root's `buf` into every rank's `buf` (same length on every
/// rank; a rank whose length differs gets an `InvalidArgument` from `recv`).
pub fn tree_broadcast<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    buf: &mut [T],
    root: usize,
) -> Result<()> {
    let (n, rank) = (comm.size(), comm.rank());
    check_rank("broadcast", "root", root, n)?;
    let v = (rank + n - root) % n;
    let real = |relative: usize| (relative + root) % n;
    if let Some(parent) = binomial_parent(v) {
        comm.recv(buf, real(parent), BROADCAST_TAG)?;
    }
    for child in binomial_children(v, n) {
        comm.send(buf, real(child), BROADCAST_TAG)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every non-root rank has exactly one parent, which lists it as a
        /// child and comes before it (so the data is there to send).
        #[test]
        fn tree_reaches_every_rank_once(n in 1usize..=300) {
            let mut parent_of = vec![None; n];
            for v in 0..n {
                for child in binomial_children(v, n) {
                    prop_assert!(child > v && child < n);
                    prop_assert!(parent_of[child].is_none(), "{} has two parents", child);
                    parent_of[child] = Some(v);
                }
            }
            for (v, parent) in parent_of.iter().enumerate() {
                prop_assert_eq!(*parent, binomial_parent(v));
            }
        }

        #[test]
        fn depth_is_logarithmic(n in 1usize..=300) {
            for v in 0..n {
                let mut depth = 0;
                let mut at = v;
                while let Some(p) = binomial_parent(at) {
                    at = p;
                    depth += 1;
                }
                prop_assert!(depth <= n.next_power_of_two().trailing_zeros() as usize);
            }
        }
    }
}
