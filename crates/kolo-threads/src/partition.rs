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

    /// The schedule of no elements, which allocates nothing.
    pub(crate) const fn none() -> Self {
        Schedule { chunks: Vec::new() }
    }

    /// Chunk `rank`.
    #[inline]
    pub(crate) fn chunk(&self, rank: usize) -> Range<usize> {
        self.chunks.get(rank).cloned().unwrap_or(0..0)
    }

    /// May rank `me` read or write `range` of any rank's buffer? Only
    /// within chunk `me`.
    #[inline]
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

/// A piece of a block that lies within one segment (see [`runs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    /// The segment's index.
    pub segment: usize,
    /// The run's elements within that segment.
    pub within: Range<usize>,
    /// The same elements in the concatenation of the segments.
    pub at: Range<usize>,
}

impl Run {
    /// Elements in the run.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.at.len()
    }
}

/// `range` of the concatenation of segments of lengths `lens`, cut into
/// blocks of at most `block` elements (from `range.start`, as [`blocks`]),
/// each block cut again where a segment ends: no run crosses a segment
/// boundary, empty segments give no runs. Stops early if the segments end
/// before `range` does.
pub(crate) fn runs<I: Iterator<Item = usize>>(
    lens: I,
    range: Range<usize>,
    block: usize,
) -> Runs<I> {
    Runs {
        lens,
        segments_seen: 0,
        segment: 0..0,
        pos: range.start,
        end: range.end,
        block_end: range.start,
        block: block.max(1),
    }
}

/// The iterator of [`runs`].
#[derive(Clone, Debug)]
pub(crate) struct Runs<I> {
    lens: I,
    /// Segments taken from `lens` so far; the current one is the last.
    segments_seen: usize,
    /// The current segment in the concatenation.
    segment: Range<usize>,
    pos: usize,
    end: usize,
    block_end: usize,
    block: usize,
}

impl<I: Iterator<Item = usize>> Iterator for Runs<I> {
    type Item = Run;

    #[inline]
    fn next(&mut self) -> Option<Run> {
        if self.pos >= self.end {
            return None;
        }
        while self.segment.end <= self.pos {
            let len = self.lens.next()?;
            let start = self.segment.end;
            self.segment = start..start.checked_add(len)?;
            self.segments_seen += 1;
        }
        if self.pos >= self.block_end {
            self.block_end = self.pos.saturating_add(self.block).min(self.end);
        }
        let end = self.block_end.min(self.segment.end);
        let offset = self.segment.start;
        let run = Run {
            segment: self.segments_seen - 1,
            within: self.pos - offset..end - offset,
            at: self.pos..end,
        };
        self.pos = end;
        Some(run)
    }
}

/// True if `inner` lies within `outer` (an empty `inner` inside or at the
/// edge counts).
#[inline]
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

    proptest! {
        /// Runs tile the range in order, each inside one segment and one
        /// block, at the right offset within its segment.
        #[test]
        fn runs_tile_the_range_within_segments_and_blocks(
            lens in prop::collection::vec(0usize..300, 0..40),
            cut in (0usize..=1000, 0usize..=1000),
            block in 1usize..200,
        ) {
            let total: usize = lens.iter().sum();
            let (a, b) = (cut.0.min(total), cut.1.min(total));
            let range = a.min(b)..a.max(b);
            let starts: Vec<usize> = lens
                .iter()
                .scan(0, |at, &len| { let start = *at; *at += len; Some(start) })
                .collect();
            let mut next = range.start;
            let mut last_segment = 0;
            for run in runs(lens.iter().copied(), range.clone(), block) {
                prop_assert_eq!(run.at.start, next);
                prop_assert!(!run.at.is_empty());
                prop_assert!(run.segment >= last_segment);
                last_segment = run.segment;
                let start = starts[run.segment];
                prop_assert!(lens[run.segment] > 0);
                prop_assert_eq!(run.within.clone(), run.at.start - start..run.at.end - start);
                prop_assert!(run.within.end <= lens[run.segment]);
                // Within one block of `blocks(range, block)`.
                let block_index = (run.at.start - range.start) / block;
                prop_assert!(run.at.end <= range.start + (block_index + 1) * block);
                next = run.at.end;
            }
            prop_assert_eq!(next, range.end);
        }
    }

    #[test]
    fn runs_split_blocks_at_segment_ends_and_skip_empty_segments() {
        let lens = [3usize, 0, 5, 1];
        let got: Vec<(usize, Range<usize>)> = runs(lens.into_iter(), 1..9, 4)
            .map(|r| (r.segment, r.within))
            .collect();
        // Blocks 1..5 and 5..9; segments at 0..3, 3..3, 3..8, 8..9.
        assert_eq!(got, [(0, 1..3), (2, 0..2), (2, 2..5), (3, 0..1)]);
        assert_eq!(
            runs([2usize].into_iter(), 0..5, 8).count(),
            1,
            "stops with the segments"
        );
        assert_eq!(runs(std::iter::empty(), 0..0, 8).count(), 0);
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
