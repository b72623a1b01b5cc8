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

/// The in-place allreduce's schedule over a buffer of `len` elements, in
/// two steps separated by a barrier. Step 0: rank `r` reduces chunk `r`,
/// reading that chunk of every rank's buffer and writing it in its own.
/// Step 1: rank `r` copies every other chunk from that chunk's owner into
/// its own buffer. What one rank may write in its buffer at a step, no
/// other rank may read from that buffer at that step ([`Schedule::may_read`],
/// [`Schedule::may_write`], checked by a property test).
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

    /// May rank `me`, at `step`, read `range` of rank `owner`'s buffer?
    /// Step 0: within chunk `me`, from anyone. Step 1: within chunk
    /// `owner`, from another rank.
    pub(crate) fn may_read(
        &self,
        me: usize,
        owner: usize,
        step: usize,
        range: &Range<usize>,
    ) -> bool {
        match step {
            0 => contains(&self.chunk(me), range),
            1 => owner != me && contains(&self.chunk(owner), range),
            _ => false,
        }
    }

    /// May rank `me`, at `step`, write `range` of its own buffer? Step 0:
    /// within its own chunk. Step 1: within another rank's chunk.
    pub(crate) fn may_write(&self, me: usize, step: usize, range: &Range<usize>) -> bool {
        match step {
            0 => contains(&self.chunk(me), range),
            1 => (0..self.chunks.len())
                .any(|other| other != me && contains(&self.chunk(other), range)),
            _ => false,
        }
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
        /// The safety property of the in-place allreduce: at every step,
        /// whatever a rank may write in its own buffer, no other rank may
        /// read from that buffer.
        #[test]
        fn no_rank_reads_what_its_owner_writes_in_the_same_step(
            len in 0usize..3_000, ranks in 1usize..7,
        ) {
            let schedule = Schedule::new(len, ranks, 4);
            let element = |i: usize| i..i + 1;
            for step in 0..3 {
                for owner in 0..ranks {
                    for reader in (0..ranks).filter(|&r| r != owner) {
                        for i in 0..len {
                            prop_assert!(
                                !(schedule.may_write(owner, step, &element(i))
                                    && schedule.may_read(reader, owner, step, &element(i))),
                                "step {} owner {} reader {} element {}", step, owner, reader, i
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn each_step_allows_its_own_ranges() {
        let schedule = Schedule::new(10, 3, 4);
        assert_eq!(schedule.chunk(1), 4..8);
        assert!(schedule.may_read(1, 2, 0, &(4..8)));
        assert!(!schedule.may_read(1, 2, 0, &(0..4)));
        assert!(schedule.may_read(1, 2, 1, &(8..10)));
        assert!(!schedule.may_read(1, 1, 1, &(4..8)));
        assert!(schedule.may_write(1, 0, &(4..6)));
        assert!(schedule.may_write(1, 1, &(0..4)));
        assert!(!schedule.may_write(1, 1, &(4..8)));
        assert!(!schedule.may_write(1, 2, &(0..4)));
    }

    #[test]
    fn containment() {
        assert!(contains(&(2..10), &(2..10)));
        assert!(contains(&(2..10), &(4..4)));
        assert!(!contains(&(2..10), &(1..3)));
    }
}
