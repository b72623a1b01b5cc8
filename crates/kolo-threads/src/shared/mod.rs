//! The one module where ranks touch each other's memory.
//!
//! Every collective is a *round*. Each rank publishes a descriptor in its
//! own slot — its [`Call`] and (pointer, length) views of its buffers, or
//! of a *segment table* listing (pointer, length) per segment of a
//! scattered buffer ([`segments`]) — and waits at the opening barrier.
//! Between the opening and the closing barrier the ranks read each other's
//! slots and published buffers in place; after the closing barrier nobody
//! does. The raw accesses rest on five invariants, each enforced here
//! rather than by the callers:
//!
//! 1. A slot is written only by its rank and only before the opening
//!    barrier of that rank's round; every round ends with a barrier that no
//!    rank passes before every rank has stopped reading slots.
//! 2. A published buffer — a segment table and every segment it lists
//!    included — stays borrowed (for `'r`) by its owner's [`Round`] until
//!    the owner has passed the closing barrier, so it outlives every peer's
//!    reads.
//! 3. A read-only buffer is published from a shared borrow: nobody writes
//!    it during the round (a segment table itself is always read-only). An
//!    in-place buffer is read and written only where the [`Schedule`] gives
//!    the accessing rank sole use of the range (checked on every access,
//!    against a schedule every rank computes from the same published
//!    length). In-place segments are one virtual buffer, their
//!    concatenation in table order: the schedule covers its total length,
//!    and a rank touches a run of a segment only where that run's place in
//!    the concatenation lies in the rank's range; before the first access
//!    every rank checks that all tables list the same lengths, so a range
//!    of the concatenation is the same piece of every rank's segments, and
//!    no run crosses the end of a segment.
//! 4. A buffer is read as `T` only if it was published as exactly `T`; a
//!    segment table is read as [`Segment`] entries only if it was published
//!    as a table, and its segments as `T` only if they were published as
//!    exactly `T`.
//! 5. A view borrows the round, so it cannot live across a barrier
//!    ([`Round::sync`] takes `&mut self`, [`Round::close`] takes `self`),
//!    and a rank that leaves a round early (a panic, an internal error)
//!    first marks itself down and waits at the next barrier: the round then
//!    fails on every rank and nobody reads its buffers after it left.

use crate::barrier::Wait;
use crate::call::{Call, Kind, PeerArgs};
use crate::partition::Schedule;
use crate::validate;
use crate::world::World;
use crossbeam_utils::CachePadded;
use kolo_transport::{Element, TransportError};
use std::any::TypeId;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::Range;

mod segments;

pub(crate) use segments::{Segment, SegmentTable};

/// The buffers a rank may publish in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Buf {
    /// The send buffer, or the in-place buffer of allreduce.
    Send = 0,
    /// The receive buffer (usually its length only).
    Recv = 1,
    /// `counts`, or alltoallv's `send_counts`.
    Counts = 2,
    /// alltoallv's `recv_counts`.
    RecvCounts = 3,
}

/// What peers may do with a published buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Only the length is published.
    LenOnly,
    /// Peers may read all of it; nobody writes it during the round.
    ReadOnly,
    /// The owner reduces in place following the chunk schedule.
    InPlace,
    /// A segment table (see [`segments`]) whose segments peers may read
    /// all of; nobody writes them during the round.
    SegmentsReadOnly,
    /// A segment table whose segments are reduced in place following the
    /// chunk schedule over their concatenation.
    SegmentsInPlace,
}

#[derive(Clone, Copy, Debug)]
struct RawBuf {
    ptr: *const (),
    len: usize,
    type_id: Option<TypeId>,
    access: Access,
}

const ABSENT: RawBuf = RawBuf {
    ptr: std::ptr::null(),
    len: 0,
    type_id: None,
    access: Access::LenOnly,
};

#[derive(Clone, Copy, Debug)]
struct Descriptor {
    call: Call,
    bufs: [RawBuf; 4],
}

/// One descriptor slot per rank.
pub(crate) struct Slots {
    cells: Box<[CachePadded<UnsafeCell<Descriptor>>]>,
}

// SAFETY: a slot is written only by its own rank and read by the others only
// while no write can happen (invariant 1; the barriers order the accesses);
// the raw pointers it holds are dereferenced only under invariants 2-4.
unsafe impl Sync for Slots {}
// SAFETY: as above; the slots own no thread-bound data.
unsafe impl Send for Slots {}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("ranks", &self.cells.len())
            .finish()
    }
}

impl Slots {
    pub(crate) fn new(size: usize) -> Self {
        let empty = Descriptor {
            call: Call::plain(Kind::Barrier),
            bufs: [ABSENT; 4],
        };
        Slots {
            cells: (0..size)
                .map(|_| CachePadded::new(UnsafeCell::new(empty)))
                .collect(),
        }
    }
}

/// A rank's descriptor under construction, borrowing its buffers for `'r`.
pub(crate) struct Publication<'r> {
    desc: Descriptor,
    _borrows: PhantomData<&'r mut ()>,
}

impl<'r> Publication<'r> {
    pub(crate) fn new(call: Call) -> Self {
        Publication {
            desc: Descriptor {
                call,
                bufs: [ABSENT; 4],
            },
            _borrows: PhantomData,
        }
    }

    fn with(mut self, which: Buf, raw: RawBuf) -> Self {
        self.desc.bufs[which as usize] = raw;
        self
    }

    /// Lets peers read `data` during the round.
    pub(crate) fn read_only<T: Sync + 'static>(self, which: Buf, data: &'r [T]) -> Self {
        self.with(
            which,
            RawBuf {
                ptr: data.as_ptr().cast(),
                len: data.len(),
                type_id: Some(TypeId::of::<T>()),
                access: Access::ReadOnly,
            },
        )
    }

    /// Reduces `data` (the send buffer) in place under the [`Schedule`].
    pub(crate) fn in_place<T: Element>(self, data: &'r mut [T]) -> Self {
        self.with(
            Buf::Send,
            RawBuf {
                ptr: data.as_mut_ptr().cast_const().cast(),
                len: data.len(),
                type_id: Some(TypeId::of::<T>()),
                access: Access::InPlace,
            },
        )
    }

    /// Publishes only a length.
    pub(crate) fn len_only(self, which: Buf, len: usize) -> Self {
        self.with(which, RawBuf { len, ..ABSENT })
    }
}

/// An error that only a bug in this crate can cause.
pub(crate) fn internal(what: String) -> TransportError {
    TransportError::Backend(format!("kolo-threads internal error: {what}"))
}

/// One rank's part in one collective; see the module docs.
pub(crate) struct Round<'w, 'r> {
    world: &'w World,
    rank: usize,
    /// True while leaving would let peers read freed memory.
    armed: bool,
    /// The schedule of an in-place send buffer (of no elements otherwise).
    schedule: Schedule,
    own: Descriptor,
    _borrows: PhantomData<&'r mut ()>,
}

impl<'w, 'r> Round<'w, 'r> {
    /// Publishes `publication` in `rank`'s slot, waits until every rank has
    /// published (failing at once if a rank is down), and checks that the
    /// calls fit together: if not, every rank closes the round and returns
    /// the same `InvalidArgument`.
    pub(crate) fn open(
        world: &'w World,
        rank: usize,
        publication: Publication<'r>,
    ) -> Result<Self, TransportError> {
        let own = publication.desc;
        let cell = world
            .slots
            .cells
            .get(rank)
            .ok_or_else(|| internal(format!("no slot for rank {rank}")))?;
        // SAFETY: invariant 1. Only this rank writes slot `rank`, and no peer
        // reads it now: peers read it only between the opening and closing
        // barriers of a round, and this rank has passed the last barrier of
        // its previous round (or that round failed at its opening on every
        // rank, before anyone read).
        unsafe { *cell.get() = own };
        world.barrier_wait(Wait::Abortable)?;
        let mut round = Round {
            world,
            rank,
            armed: true,
            schedule: Schedule::none(),
            own,
            _borrows: PhantomData,
        };
        let in_place = own.bufs[Buf::Send as usize];
        let len = match in_place.access {
            Access::InPlace => in_place.len,
            Access::SegmentsInPlace => segments::total(round.table(in_place)),
            Access::LenOnly | Access::ReadOnly | Access::SegmentsReadOnly => 0,
        };
        round.schedule = Schedule::new(len, world.size, chunk_align(own.call));
        let verdict = validate::check(&round.args()?);
        match verdict {
            Ok(()) => Ok(round),
            Err(message) => {
                round.close()?;
                Err(TransportError::InvalidArgument(message))
            }
        }
    }

    fn desc(&self, peer: usize) -> Result<Descriptor, TransportError> {
        let cell = self
            .world
            .slots
            .cells
            .get(peer)
            .ok_or_else(|| internal(format!("no slot for rank {peer}")))?;
        // SAFETY: invariant 1. Every rank has passed this round's opening
        // barrier, which orders its slot write before this read, and none
        // writes its slot again before this rank has passed the round's
        // closing barrier (which needs this round to end first).
        Ok(unsafe { *cell.get() })
    }

    /// `raw` as a `&[T]` if it was published read-only as exactly `T`.
    fn read_only<T: Sync + 'static>(&self, raw: RawBuf) -> Option<&[T]> {
        if raw.access != Access::ReadOnly || raw.type_id != Some(TypeId::of::<T>()) {
            return None;
        }
        // SAFETY: invariants 2-4. The pointer and length come from a live
        // `&'r [T]` of exactly this `T` (checked above), which its owner keeps
        // borrowed until it has passed this round's closing barrier; that
        // cannot happen before this view (borrowing `self`) is gone, and
        // nobody writes through a shared borrow.
        Some(unsafe { std::slice::from_raw_parts(raw.ptr.cast::<T>(), raw.len) })
    }

    /// What every rank called, with its lengths and count arrays.
    fn args(&self) -> Result<Vec<PeerArgs<'_>>, TransportError> {
        (0..self.world.size)
            .map(|peer| {
                let d = self.desc(peer)?;
                Ok(PeerArgs {
                    call: d.call,
                    send_len: d.bufs[Buf::Send as usize].len,
                    recv_len: d.bufs[Buf::Recv as usize].len,
                    counts: self.read_only(d.bufs[Buf::Counts as usize]).unwrap_or(&[]),
                    recv_counts: self
                        .read_only(d.bufs[Buf::RecvCounts as usize])
                        .unwrap_or(&[]),
                    segments: self.table(d.bufs[Buf::Send as usize]),
                })
            })
            .collect()
    }

    /// `peer`'s read-only buffer `which`.
    pub(crate) fn view<T: Sync + 'static>(
        &self,
        peer: usize,
        which: Buf,
    ) -> Result<&[T], TransportError> {
        let raw = self.desc(peer)?.bufs[which as usize];
        self.read_only(raw).ok_or_else(|| {
            internal(format!(
                "rank {peer}'s {which:?} buffer is not readable as this type"
            ))
        })
    }

    /// The schedule of the in-place buffer.
    pub(crate) fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Checks that `peer` published an in-place buffer of `T` scheduled
    /// like this rank's, and returns it.
    fn in_place_buf<T: Element>(&self, peer: usize) -> Result<RawBuf, TransportError> {
        let raw = self.desc(peer)?.bufs[Buf::Send as usize];
        let own = self.own.bufs[Buf::Send as usize];
        if raw.access != Access::InPlace
            || own.access != Access::InPlace
            || raw.type_id != Some(TypeId::of::<T>())
            || raw.len != own.len
        {
            return Err(internal(format!(
                "rank {peer}'s in-place buffer does not match rank {}'s",
                self.rank
            )));
        }
        Ok(raw)
    }

    /// The raw start of `range` in `owner`'s in-place buffer of `T`, if the
    /// schedule gives this rank that range ([`Schedule::may_access`]).
    fn in_place_ptr<T: Element>(
        &self,
        owner: usize,
        range: &Range<usize>,
    ) -> Result<*mut T, TransportError> {
        let raw = self.in_place_buf::<T>(owner)?;
        self.check_access(owner, range, raw.len)?;
        // SAFETY: `range.start <= range.end <= raw.len` (checked), so the
        // offset stays within (or one past) the published allocation.
        Ok(unsafe { raw.ptr.cast::<T>().cast_mut().add(range.start) })
    }

    /// Calls `f` with `range` of this rank's in-place buffer (writable) and
    /// the same range of every peer's (read-only, in rank order, this rank
    /// left out), if the schedule gives this rank that range.
    pub(crate) fn in_place_with<T: Element, R>(
        &mut self,
        range: Range<usize>,
        f: impl FnOnce(&mut [T], &[&[T]]) -> R,
    ) -> Result<R, TransportError> {
        let own = self.in_place_ptr::<T>(self.rank, &range)?;
        let peers = (0..self.world.size)
            .filter(|&peer| peer != self.rank)
            .map(|peer| {
                let ptr = self.in_place_ptr::<T>(peer, &range)?;
                // SAFETY: invariants 2-4. The buffer is a live `&'r mut [T]`
                // of exactly `T` lent to its owner's round (the owner cannot
                // touch it meanwhile) and `range` is in bounds. Every rank
                // follows the same schedule (same length and type, checked),
                // which lets no other rank touch `range` of any buffer.
                Ok(unsafe { std::slice::from_raw_parts(ptr.cast_const(), range.len()) })
            })
            .collect::<Result<Vec<&[T]>, TransportError>>()?;
        // SAFETY: as above for this rank's own buffer, published from a
        // mutable borrow; it is a different allocation from every peer's
        // (each rank lends its own `&mut [T]`), so `own` aliases nothing in
        // `peers`, and `&mut self` rules out any other view in this thread.
        let own = unsafe { std::slice::from_raw_parts_mut(own, range.len()) };
        Ok(f(own, &peers))
    }

    /// Copies `range` of this rank's in-place buffer into the same range of
    /// every peer's, if the schedule gives this rank that range.
    pub(crate) fn in_place_spread<T: Element>(
        &mut self,
        range: Range<usize>,
    ) -> Result<(), TransportError> {
        let own = self.in_place_ptr::<T>(self.rank, &range)?;
        // SAFETY: as in `in_place_with`; only read here.
        let src = unsafe { std::slice::from_raw_parts(own.cast_const(), range.len()) };
        for peer in (0..self.world.size).filter(|&peer| peer != self.rank) {
            let ptr = self.in_place_ptr::<T>(peer, &range)?;
            // SAFETY: invariants 2-4 as in `in_place_with`, for a peer's
            // buffer published from a mutable borrow: nobody else touches
            // `range` of it now, and it is a different allocation from
            // this rank's `src`.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr, range.len()) };
            dst.copy_from_slice(src);
        }
        Ok(())
    }

    /// Fails unless the schedule lets this rank touch `range` of `owner`'s
    /// buffer (of `len` elements).
    fn check_access(
        &self,
        owner: usize,
        range: &Range<usize>,
        len: usize,
    ) -> Result<(), TransportError> {
        if !self.schedule.may_access(self.rank, range) || range.end > len {
            return Err(internal(format!(
                "rank {} may not touch {range:?} of rank {owner}",
                self.rank
            )));
        }
        Ok(())
    }

    /// Waits until every rank has finished reading; the buffers are free
    /// again afterwards.
    pub(crate) fn close(mut self) -> Result<(), TransportError> {
        self.armed = false;
        self.world.barrier_wait(Wait::Complete)
    }
}

impl Drop for Round<'_, '_> {
    fn drop(&mut self) {
        if self.armed {
            // Leaving early (invariant 5): fail the round for everyone, and
            // keep the buffers alive until every peer has stopped reading.
            self.world.mark_down(
                self.rank,
                format!(
                    "rank {} abandoned {} (a panic or an internal error inside it)",
                    self.rank,
                    self.own.call.kind.name()
                ),
            );
            let _ = self.world.barrier_wait(Wait::Complete);
        }
    }
}

/// Chunk boundaries fall on 64-byte lines of the element type.
fn chunk_align(call: Call) -> usize {
    call.elem.map_or(1, |e| (64 / e.dtype.size()).max(1))
}
