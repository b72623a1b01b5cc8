//! Allreduce over scattered segments (the tensors of a fused response) as
//! one collective, with no fusion buffer: the segments are one virtual
//! buffer, their concatenation, reduced exactly as `allreduce` reduces a
//! packed copy of it.
//!
//! Each rank publishes its segment table ([`SegmentTable`], reused across
//! calls); the opening barrier's verdict checks that every rank passed the
//! same segment lengths, element type, operation and scale. Then, as in
//! [`crate::allreduce`]: a small total takes the small path (every rank
//! reduces the whole concatenation from every rank's segments into its
//! scratch, in rank order, and copies it back into its own segments after
//! the closing barrier); a larger one takes the in-place path (the
//! schedule over the total length gives each rank a chunk of the
//! concatenation, processed in 8 KiB blocks cut at segment ends; each run
//! is reduced by [`RunReducer`], the same code as `allreduce`'s blocks,
//! and spread to every peer's same run while in cache). Same path for the
//! same total, same reduction order per element: the results are bit for
//! bit those of `allreduce` over the packed concatenation.

use crate::allreduce::{block_len, takes_small_path, RunReducer};
use crate::call::{Call, Kind};
use crate::comm::ThreadComm;
use crate::reduce::reduce_scaled;
use crate::scratch::Slot;
use crate::shared::{internal, Publication, Round, SegmentTable};
use kolo_protocol::ReduceOp;
use kolo_transport::{Element, Scale, TransportError};

pub(crate) fn allreduce_segments<T: Element>(
    comm: &mut ThreadComm,
    segments: &mut [&mut [T]],
    op: ReduceOp,
    scale: Scale,
) -> Result<(), TransportError> {
    let call = Call::reduce::<T>(Kind::AllreduceSegments, op, scale);
    let total = segments
        .iter()
        .try_fold(0usize, |sum, s| sum.checked_add(s.len()))
        .ok_or_else(|| internal("segment lengths overflow usize".into()))?;
    let bytes = total.saturating_mul(std::mem::size_of::<T>());
    if takes_small_path(bytes, comm.world.size) {
        small(comm, segments, total, call, op, scale)
    } else {
        in_place(comm, segments, call, op, scale)
    }
}

fn small<T: Element>(
    comm: &mut ThreadComm,
    segments: &mut [&mut [T]],
    total: usize,
    call: Call,
    op: ReduceOp,
    scale: Scale,
) -> Result<(), TransportError> {
    let ThreadComm {
        world,
        rank,
        scratch,
        segments: table,
        ..
    } = comm;
    let size = world.size;
    let mut out = scratch.take::<T>(Slot::Out, total);
    let mut scaled = scratch.take::<T>(Slot::Scaled, 0);
    {
        let published = SegmentTable::read_only(table, &*segments);
        let round = Round::open(world, *rank, Publication::new(call).segments(published))?;
        let mut srcs: Vec<&[T]> = Vec::with_capacity(size);
        let mut at = 0;
        for (index, segment) in segments.iter().enumerate() {
            srcs.clear();
            for peer in 0..size {
                srcs.push(round.segment_view::<T>(peer, index)?);
            }
            let dst = &mut out[at..at + segment.len()];
            reduce_scaled(dst, &srcs, op, scale.prescale, &mut scaled);
            at += segment.len();
        }
        drop(srcs);
        round.close()?;
    }
    let reduced = &mut out[..total];
    T::scale(reduced, scale.postscale_for(op, size));
    let mut at = 0;
    for segment in segments.iter_mut() {
        segment.copy_from_slice(&reduced[at..at + segment.len()]);
        at += segment.len();
    }
    scratch.put(Slot::Out, out);
    scratch.put(Slot::Scaled, scaled);
    Ok(())
}

fn in_place<T: Element>(
    comm: &mut ThreadComm,
    segments: &mut [&mut [T]],
    call: Call,
    op: ReduceOp,
    scale: Scale,
) -> Result<(), TransportError> {
    let ThreadComm {
        world,
        rank,
        scratch,
        segments: table,
        ..
    } = comm;
    let rank = *rank;
    let block = block_len::<T>();
    let mut out = scratch.take::<T>(Slot::Out, block);
    let mut scaled = scratch.take::<T>(Slot::Scaled, 0);
    let mut reduce = RunReducer {
        rank,
        op,
        prescale: scale.prescale,
        post: scale.postscale_for(op, world.size),
        out: &mut out,
        scaled: &mut scaled,
    };
    let published = table.in_place(segments);
    let mut round = Round::open(world, rank, Publication::new(call).segments(published))?;
    round.segments_in_place::<T>(block, |own, peers| reduce.run(own, peers))?;
    round.close()?;
    scratch.put(Slot::Out, out);
    scratch.put(Slot::Scaled, scaled);
    Ok(())
}
