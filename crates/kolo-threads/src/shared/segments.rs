//! Segment tables: a rank's scattered buffers (the tensors of a fused
//! allreduce) published as one virtual buffer, their concatenation.
//!
//! A rank enters (pointer, length) per segment in its [`SegmentTable`], a
//! vector kept by its communicator and refilled by every call (so steady
//! use allocates nothing), and publishes the table itself as its send
//! buffer: peers read the table, then the segments it lists, under the
//! invariants of the parent module (the table is read-only; the segments
//! are read-only or in place under the schedule over their concatenation).

use super::{internal, Access, Publication, RawBuf, Round};
use crate::partition::{contains, runs, Run};
use kolo_transport::{Element, TransportError};
use std::any::TypeId;

/// One entry of a segment table: where a segment lies and how many
/// elements it holds. Only this module dereferences the pointer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    ptr: *mut (),
    len: usize,
}

impl Segment {
    /// Elements in the segment.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// An entry of `len` elements that points nowhere (validation tests).
    #[cfg(test)]
    pub(crate) fn len_only(len: usize) -> Self {
        Segment {
            ptr: std::ptr::null_mut(),
            len,
        }
    }
}

/// Total elements of `table`'s segments (saturating: real slices cannot
/// overflow, and a saturated total fails the access checks).
pub(super) fn total(table: &[Segment]) -> usize {
    table
        .iter()
        .fold(0usize, |sum, segment| sum.saturating_add(segment.len))
}

/// A rank's reusable segment table.
#[derive(Debug, Default)]
pub(crate) struct SegmentTable {
    entries: Vec<Segment>,
}

// SAFETY: the table holds addresses only; they are dereferenced only during
// a round of the rank that filled it, under the parent module's
// invariants, and moving the table to another thread between rounds moves
// no access to the memory they point to.
unsafe impl Send for SegmentTable {}

/// Segments entered in a table, borrowed (the table and the segments) for
/// `'r`: what [`Publication::segments`] publishes.
#[derive(Debug)]
pub(crate) struct Segments<'r> {
    entries: &'r [Segment],
    type_id: TypeId,
    access: Access,
}

impl SegmentTable {
    /// The address and capacity of the table's allocation (tests of its
    /// reuse).
    #[cfg(test)]
    pub(crate) fn allocation(&self) -> (usize, usize) {
        (self.entries.as_ptr() as usize, self.entries.capacity())
    }

    fn fill(&mut self, entries: impl Iterator<Item = Segment>) -> &[Segment] {
        self.entries.clear();
        self.entries.extend(entries);
        &self.entries
    }

    /// Lets peers read `segments` during the round.
    pub(crate) fn read_only<'r, T: Element>(
        &'r mut self,
        segments: &'r [&mut [T]],
    ) -> Segments<'r> {
        let entries = self.fill(segments.iter().map(|s| Segment {
            ptr: s.as_ptr().cast_mut().cast(),
            len: s.len(),
        }));
        Segments {
            entries,
            type_id: TypeId::of::<T>(),
            access: Access::SegmentsReadOnly,
        }
    }

    /// Reduces `segments` in place under the schedule over their
    /// concatenation.
    pub(crate) fn in_place<'r, T: Element>(
        &'r mut self,
        segments: &'r mut [&mut [T]],
    ) -> Segments<'r> {
        let entries = self.fill(segments.iter_mut().map(|s| Segment {
            ptr: s.as_mut_ptr().cast(),
            len: s.len(),
        }));
        Segments {
            entries,
            type_id: TypeId::of::<T>(),
            access: Access::SegmentsInPlace,
        }
    }
}

impl<'r> Publication<'r> {
    /// Publishes a segment table as the send buffer.
    pub(crate) fn segments(self, segments: Segments<'r>) -> Self {
        self.with(
            super::Buf::Send,
            RawBuf {
                ptr: segments.entries.as_ptr().cast(),
                len: segments.entries.len(),
                type_id: Some(segments.type_id),
                access: segments.access,
            },
        )
    }
}

/// The start of `run` in a segment of `table`, checked to lie within it.
#[inline]
fn run_ptr<T>(table: &[Segment], run: &Run) -> Result<*mut T, TransportError> {
    let segment = table
        .get(run.segment)
        .ok_or_else(|| internal(format!("no segment {} to hold {run:?}", run.segment)))?;
    if run.within.start > run.within.end || run.within.end > segment.len {
        return Err(internal(format!(
            "{run:?} does not fit in a segment of {} elements",
            segment.len
        )));
    }
    // SAFETY: `within.start <= segment.len` (checked), so the offset stays
    // within (or one past) the segment's published allocation.
    Ok(unsafe { segment.ptr.cast::<T>().add(run.within.start) })
}

impl Round<'_, '_> {
    /// The entries of a published segment table, or none if `raw` is not
    /// one.
    pub(super) fn table(&self, raw: RawBuf) -> &[Segment] {
        if !matches!(
            raw.access,
            Access::SegmentsReadOnly | Access::SegmentsInPlace
        ) {
            return &[];
        }
        // SAFETY: invariants 2-4. `raw` was published by `Publication::
        // segments` (its access says so) from a live `&'r [Segment]`, which
        // its owner keeps borrowed until it has passed this round's closing
        // barrier; that cannot happen before this view (borrowing `self`) is
        // gone, and nobody writes a published table.
        unsafe { std::slice::from_raw_parts(raw.ptr.cast::<Segment>(), raw.len) }
    }

    /// `peer`'s segment table, checked to be published with `access` as
    /// segments of exactly `T`.
    fn table_of<T: 'static>(
        &self,
        peer: usize,
        access: Access,
    ) -> Result<&[Segment], TransportError> {
        let raw = self.desc(peer)?.bufs[super::Buf::Send as usize];
        if raw.access != access || raw.type_id != Some(TypeId::of::<T>()) {
            return Err(internal(format!(
                "rank {peer} did not publish segments of this type as {access:?}"
            )));
        }
        Ok(self.table(raw))
    }

    /// Segment `index` of `peer`'s read-only segments of `T`.
    pub(crate) fn segment_view<T: Element>(
        &self,
        peer: usize,
        index: usize,
    ) -> Result<&[T], TransportError> {
        let own = self.table_of::<T>(self.rank, Access::SegmentsReadOnly)?;
        let table = self.table_of::<T>(peer, Access::SegmentsReadOnly)?;
        match (table.get(index), own.get(index)) {
            (Some(segment), Some(mine)) if segment.len == mine.len => {
                // SAFETY: invariants 2-4. The segment is part of a live
                // `&'r [&mut [T]]` of exactly `T` (checked above) that its
                // owner lent read-only to its round, so nobody writes it
                // until the owner has passed the closing barrier, which
                // needs this view (borrowing `self`) gone first.
                Ok(unsafe {
                    std::slice::from_raw_parts(segment.ptr.cast::<T>().cast_const(), segment.len)
                })
            }
            _ => Err(internal(format!(
                "rank {peer}'s segment {index} does not match rank {}'s",
                self.rank
            ))),
        }
    }

    /// The in-place path over segments: for every run of this rank's chunk
    /// of the concatenation (block by block of `block` elements, each block
    /// cut at segment ends), calls `f` with the run of this rank's segment
    /// (writable) and the same run of every peer's (read-only, in rank
    /// order, this rank left out), then copies the run into every peer's
    /// segment while it is still in cache.
    pub(crate) fn segments_in_place<T: Element>(
        &mut self,
        block: usize,
        mut f: impl FnMut(&mut [T], &[&[T]]),
    ) -> Result<(), TransportError> {
        let rank = self.rank;
        let own = self.table_of::<T>(rank, Access::SegmentsInPlace)?;
        let peers = (0..self.world.size)
            .filter(|&peer| peer != rank)
            .map(|peer| self.table_of::<T>(peer, Access::SegmentsInPlace))
            .collect::<Result<Vec<_>, _>>()?;
        // Invariant 3: the same lengths everywhere (the verdict checked
        // them; a disagreement here is a bug, caught before any access).
        let lens = |table: &[Segment]| table.iter().map(Segment::len).collect::<Vec<_>>();
        if let Some(index) = peers
            .iter()
            .position(|t| t.len() != own.len() || t.iter().zip(own).any(|(s, o)| s.len != o.len))
        {
            let peer = if index < rank { index } else { index + 1 };
            return Err(internal(format!(
                "rank {peer}'s segment lengths {:?} differ from rank {rank}'s {:?}",
                lens(peers[index]),
                lens(own)
            )));
        }
        let chunk = self.schedule.chunk(rank);
        // Each run's start in every peer's segment, found once per run for
        // both the reads and the writes.
        let mut starts: Vec<*mut T> = Vec::with_capacity(peers.len());
        let mut views: Vec<&[T]> = Vec::with_capacity(peers.len());
        for run in runs(own.iter().map(Segment::len), chunk.clone(), block) {
            // `Schedule::may_access` with the chunk looked up once (per run
            // it measured 3% of a 1-rank step of 1,000 tensors).
            if !contains(&chunk, &run.at) {
                return Err(internal(format!("rank {rank} may not touch {run:?}")));
            }
            let len = run.len();
            let own_ptr = run_ptr::<T>(own, &run)?;
            starts.clear();
            for table in &peers {
                starts.push(run_ptr::<T>(table, &run)?);
            }
            views.clear();
            views.extend(starts.iter().map(|&ptr| {
                // SAFETY: invariants 2-4. The segment is part of a live
                // `&'r mut [&mut [T]]` of exactly `T` (checked) lent to its
                // owner's round, the run lies within it (checked by
                // `run_ptr`), and the schedule over the same lengths on
                // every rank (checked) gives this rank sole use of
                // `run.at`, so nobody writes these elements meanwhile.
                unsafe { std::slice::from_raw_parts(ptr.cast_const(), len) }
            }));
            // SAFETY: as above for this rank's own segment, lent from a
            // mutable borrow; it is a different allocation from every
            // peer's (each rank lends its own `&mut`), and from this rank's
            // other segments (distinct `&mut` borrows), so it aliases
            // nothing in `views`; `&mut self` rules out other views here.
            let own_run = unsafe { std::slice::from_raw_parts_mut(own_ptr, len) };
            f(own_run, &views);
            views.clear();
            for &ptr in &starts {
                // SAFETY: invariants 2-4 as above, for a peer's segment
                // lent from a mutable borrow: nobody else touches `run.at`
                // of it now, no view of it is left (`views` was cleared),
                // and it is a different allocation from `own_run`.
                let dst = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                dst.copy_from_slice(own_run);
            }
        }
        Ok(())
    }
}
