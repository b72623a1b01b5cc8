//! A buffer cut into one contiguous block per rank, and the argument checks
//! shared by the algorithms.

use crate::error::{Result, TransportError};
use std::ops::Range;

/// Block `b` of a buffer is `offsets[b]..offsets[b + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blocks {
    offsets: Vec<usize>,
}

impl Blocks {
    /// Blocks of the given sizes, one per rank. `counts.len()` must be
    /// `size` and the total must fit in `usize`.
    pub(crate) fn from_counts(op: &str, what: &str, counts: &[usize], size: usize) -> Result<Self> {
        if counts.len() != size {
            return Err(TransportError::InvalidArgument(format!(
                "{op}: {what} has {} entries but the communicator has {size} ranks",
                counts.len()
            )));
        }
        let mut offsets = Vec::with_capacity(size + 1);
        let mut total = 0usize;
        offsets.push(0);
        for &count in counts {
            total = total.checked_add(count).ok_or_else(|| {
                TransportError::InvalidArgument(format!(
                    "{op}: the sum of {what} {counts:?} overflows"
                ))
            })?;
            offsets.push(total);
        }
        Ok(Blocks { offsets })
    }

    /// `len` elements cut into `n` blocks as equal as possible: the first
    /// `len % n` blocks are one element longer.
    pub(crate) fn even(len: usize, n: usize) -> Self {
        let n = n.max(1);
        let (base, extra) = (len / n, len % n);
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        let mut total = 0;
        for b in 0..n {
            total += base + usize::from(b < extra);
            offsets.push(total);
        }
        Blocks { offsets }
    }

    /// The element range of block `b`.
    pub(crate) fn range(&self, b: usize) -> Range<usize> {
        self.offsets[b]..self.offsets[b + 1]
    }

    /// Sum of all block lengths.
    pub(crate) fn total(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// The longest block.
    pub(crate) fn max_len(&self) -> usize {
        self.offsets
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }
}

/// `Err(InvalidArgument)` unless `got == want`.
pub(crate) fn check_len(op: &str, what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(TransportError::InvalidArgument(format!(
            "{op}: {what} has {got} elements, expected {want}"
        )))
    }
}

/// `Err(InvalidArgument)` unless `rank < size`.
pub(crate) fn check_rank(op: &str, what: &str, rank: usize, size: usize) -> Result<()> {
    if rank < size {
        Ok(())
    } else {
        Err(TransportError::InvalidArgument(format!(
            "{op}: {what} {rank} is out of range for a communicator of {size} ranks"
        )))
    }
}

/// Borrows two disjoint ranges of `buf`: `send` shared, `recv` mutable.
///
/// # Panics
/// If the ranges overlap or exceed `buf` (a kolo bug: callers pass distinct
/// blocks of one [`Blocks`] that tiles `buf`).
pub(crate) fn split_send_recv<T>(
    buf: &mut [T],
    send: Range<usize>,
    recv: Range<usize>,
) -> (&[T], &mut [T]) {
    if send.end <= recv.start {
        let (low, high) = buf.split_at_mut(recv.start);
        (&low[send], &mut high[..recv.len()])
    } else {
        assert!(
            recv.end <= send.start,
            "blocks {send:?} and {recv:?} overlap"
        );
        let (low, high) = buf.split_at_mut(send.start);
        (&high[..send.len()], &mut low[recv])
    }
}

/// The block a ring step handles, `(rank - back) mod n` without underflow.
pub(crate) fn ring_index(rank: usize, back: usize, n: usize) -> usize {
    (rank + n - back % n) % n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn even_blocks_tile_the_buffer(len in 0usize..10_000, n in 1usize..64) {
            let blocks = Blocks::even(len, n);
            prop_assert_eq!(blocks.total(), len);
            let lens: Vec<usize> = (0..n).map(|b| blocks.range(b).len()).collect();
            let (min, max) = (lens.iter().min().copied(), lens.iter().max().copied());
            prop_assert!(max.unwrap_or(0) - min.unwrap_or(0) <= 1);
            prop_assert_eq!(blocks.max_len(), max.unwrap_or(0));
            for b in 1..n {
                prop_assert_eq!(blocks.range(b - 1).end, blocks.range(b).start);
            }
        }

        #[test]
        fn counted_blocks_follow_the_counts(counts in prop::collection::vec(0usize..100, 1..16)) {
            let blocks = Blocks::from_counts("op", "counts", &counts, counts.len()).unwrap();
            for (b, &count) in counts.iter().enumerate() {
                prop_assert_eq!(blocks.range(b).len(), count);
            }
            prop_assert_eq!(blocks.total(), counts.iter().sum::<usize>());
        }

        #[test]
        fn split_gives_the_requested_ranges(
            counts in prop::collection::vec(0usize..10, 2..8),
            a in 0usize..8,
            b in 0usize..8,
        ) {
            let n = counts.len();
            let (a, b) = (a % n, b % n);
            prop_assume!(a != b);
            let blocks = Blocks::from_counts("op", "counts", &counts, n).unwrap();
            let mut buf: Vec<usize> = (0..blocks.total()).collect();
            let (send, recv) = split_send_recv(&mut buf, blocks.range(a), blocks.range(b));
            prop_assert_eq!(send.first().copied(), blocks.range(a).next());
            prop_assert_eq!(send.len(), counts[a]);
            prop_assert_eq!(recv.first().copied(), blocks.range(b).next());
            prop_assert_eq!(recv.len(), counts[b]);
        }
    }

    #[test]
    fn bad_counts_name_the_values() {
        let err = Blocks::from_counts("allgatherv", "counts", &[1, 2, 3], 4).unwrap_err();
        assert!(
            err.to_string()
                .contains("counts has 3 entries but the communicator has 4 ranks"),
            "{err}"
        );
        let err = Blocks::from_counts("allgatherv", "counts", &[usize::MAX, 1], 2).unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
        let err = check_rank("broadcast", "root", 5, 4).unwrap_err();
        assert!(
            err.to_string()
                .contains("root 5 is out of range for a communicator of 4 ranks"),
            "{err}"
        );
    }
}
