//! How the large-message allreduce splits a buffer into one chunk per rank,
//! and which rank may touch which chunk when.

use std::ops::Range;

/// Splits `0..len` into `parts` consecutive ranges, balanced to within one
/// `align`-element unit: every boundary but the last is a multiple of
/// `align` (a cache line of elements, so two ranks never write one line).
/// Later ranges may be empty when `len` is small. `parts` and `align` must
/// be at least 1.
pub(crate) fn partition(len: usize, parts: usize, align: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    let align = align.max(1);
    let units = len.div_ceil(align);
    let (per, extra) = (units / parts, units % parts);
    let mut start = 0;
    (0..parts)
        .map(|part| {
            let take = per + usize::from(part < extra);
            let end = (start + take * align).min(len);
            let range = start..end;
            start = end;
            range
        })
        .collect()
}

/// The in-place allreduce's schedule over a buffer of `len` elements, for
/// the one step between the opening and the closing barrier. Rank `r` owns chunk `r`: it reads that chunk
/// of every rank's buffer, reduces it, and writes the result into that
/// chunk of every rank's buffer. No other rank touches chunk `r` of any
/// buffer meanwhile ([`Schedule::may_access`], checked by a property test),
/// so reads and writes never race.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Schedule {
    chunks: Vec<Range<usize>>,
}

impl Schedule {
    /// `len` elements over `ranks` chunks aligned to `align` elements.
    pub(crate) fn new(len: usize, ranks: usize, align: usize) -> Self {
        Schedule {
            chunks: partition(len, ranks, align),
        }
    }

    /// Chunk `rank`.
    pub(crate) fn chunk(&self, rank: usize) -> Range<usize> {
        self.chunks.get(rank).cloned().unwrap_or(0..0)
    }

    /// May rank `me` read or write `range` of any rank's buffer? Only
    /// within chunk `me`.
    pub(crate) fn may_access(&self, me: usize, range: &Range<usize>) -> bool {
        contains(&self.chunk(me), range)
    }
}

/// `range` cut into consecutive blocks of at most `block` elements.
pub(crate) fn blocks(range: Range<usize>, block: usize) -> impl Iterator<Item = Range<usize>> {
    let block = block.max(1);
    range
        .clone()
        .step_by(block)
        .map(move |start| start..(start + block).min(range.end))
}

/// True if `inner` lies within `outer` (an empty `inner` inside or at the
/// edge counts).
pub(crate) fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end && inner.start <= inner.end
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn partition_tiles_the_buffer(len in 0usize..100_000, parts in 1usize..17, align in 1usize..65) {
            let ranges = partition(len, parts, align);
            prop_assert_eq!(ranges.len(), parts);
            let mut next = 0;
            for r in &ranges {
                prop_assert_eq!(r.start, next);
                prop_assert!(r.start <= r.end);
                if r.end != len {
                    prop_assert_eq!(r.end % align, 0);
                }
                next = r.end;
            }
            prop_assert_eq!(next, len);
            let sizes: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
            let max = sizes.iter().copied().max().unwrap_or(0);
            let min_nonlast = sizes[..parts - 1].iter().copied().min().unwrap_or(max);
            prop_assert!(max <= min_nonlast + align || len < parts * align);
        }

        #[test]
        fn blocks_cover_the_range(start in 0usize..1000, len in 0usize..5000, block in 1usize..700) {
            let range = start..start + len;
            let mut next = start;
            for b in blocks(range.clone(), block) {
                prop_assert_eq!(b.start, next);
                prop_assert!(!b.is_empty() && b.len() <= block);
                next = b.end;
            }
            prop_assert_eq!(next, range.end);
        }
    }

    proptest! {
        /// The safety property of the in-place allreduce: every element
        /// may be touched by exactly one rank.
        #[test]
        fn every_element_has_exactly_one_rank_touching_it(
            len in 0usize..3_000, ranks in 1usize..7,
        ) {
            let schedule = Schedule::new(len, ranks, 4);
            for i in 0..len {
                let touching = (0..ranks)
                    .filter(|&r| schedule.may_access(r, &(i..i + 1)))
                    .count();
                prop_assert_eq!(touching, 1, "element {}", i);
            }
        }
    }

    #[test]
    fn each_rank_may_touch_only_its_chunk() {
        let schedule = Schedule::new(10, 3, 4);
        assert_eq!(schedule.chunk(1), 4..8);
        assert!(schedule.may_access(1, &(4..8)));
        assert!(schedule.may_access(1, &(5..6)));
        assert!(!schedule.may_access(1, &(0..4)));
        assert!(!schedule.may_access(1, &(7..9)));
        assert!(schedule.may_access(2, &(8..10)));
    }

    #[test]
    fn containment() {
        assert!(contains(&(2..10), &(2..10)));
        assert!(contains(&(2..10), &(4..4)));
        assert!(!contains(&(2..10), &(1..3)));
    }
}
