//! Allreduce and reduce-scatter on shared memory, with no staging copies.
//!
//! Small allreduces ([`takes_small_path`]) take the low-latency path: every
//! rank reduces the whole vector from all published buffers into its
//! scratch and copies it back after the closing barrier (two barriers).
//! Each rank reads n times the vector, so the threshold shrinks with n.
//! Larger ones reduce in place ([`crate::partition::Schedule`]): each rank
//! owns a 1/n chunk; block by block (8 KiB) it reduces that chunk of every
//! rank's buffer into its own buffer (two ranks: one fused pass; more: via
//! an L1 scratch block) and at once copies the result into that chunk of
//! every peer's buffer, while the lines are still in cache. The closing
//! barrier keeps every buffer alive until no peer touches it (two
//! barriers). Compared with reducing the own chunk first and copying the
//! other chunks from their owners after a barrier, this makes one pass over
//! memory instead of two and saves a barrier, which roughly doubles the
//! busbw of large allreduces on 2 ranks. Reduce-scatter
//! reads the peers' send buffers and reduces straight into the caller's
//! receive block.

use crate::call::{Call, Kind};
use crate::comm::ThreadComm;
use crate::partition::blocks;
use crate::reduce::reduce_scaled;
use crate::scratch::Slot;
use crate::shared::{Buf, Publication, Round};
use kolo_protocol::ReduceOp;
use kolo_transport::{Element, Scale, TransportError};

/// The small path is taken while `bytes * size^2` stays within this
/// budget: 16 KiB on 2 ranks, 4 KiB on 4, 1 KiB on 8 (where the two paths
/// measured even on an idle 16-core host).
const SMALL_ALLREDUCE_BUDGET: usize = 64 * 1024;

/// Does an allreduce of `bytes` on `size` ranks take the small path?
pub(crate) fn takes_small_path(bytes: usize, size: usize) -> bool {
    bytes.saturating_mul(size.saturating_mul(size)) <= SMALL_ALLREDUCE_BUDGET
}

/// Bytes per block of the in-place path's scratch: the n source blocks,
/// the scratch and the n destination blocks stay in L1 (of 4-256 KiB,
/// 8 KiB is fastest at 1-64 MiB).
const BLOCK_BYTES: usize = 8 * 1024;

/// Elements of `T` per block of the in-place path.
pub(crate) fn block_len<T>() -> usize {
    (BLOCK_BYTES / std::mem::size_of::<T>().max(1)).max(1)
}

pub(crate) fn allreduce<T: Element>(
    comm: &mut ThreadComm,
    buf: &mut [T],
    op: ReduceOp,
    scale: Scale,
) -> Result<(), TransportError> {
    let call = Call::reduce::<T>(Kind::Allreduce, op, scale);
    if takes_small_path(std::mem::size_of_val(buf), comm.world.size) {
        small(comm, buf, call, op, scale)
    } else {
        in_place(comm, buf, call, op, scale)
    }
}

fn small<T: Element>(
    comm: &mut ThreadComm,
    buf: &mut [T],
    call: Call,
    op: ReduceOp,
    scale: Scale,
) -> Result<(), TransportError> {
    let ThreadComm {
        world,
        rank,
        scratch,
        ..
    } = comm;
    let mut out = scratch.take::<T>(Slot::Out, buf.len());
    let mut scaled = scratch.take::<T>(Slot::Scaled, 0);
    let out_block = &mut out[..buf.len()];
    {
        let round = Round::open(
            world,
            *rank,
            Publication::new(call).read_only(Buf::Send, &*buf),
        )?;
        let srcs = (0..world.size)
            .map(|peer| round.view::<T>(peer, Buf::Send))
            .collect::<Result<Vec<_>, _>>()?;
        reduce_scaled(out_block, &srcs, op, scale.prescale, &mut scaled);
        drop(srcs);
        round.close()?;
    }
    T::scale(out_block, scale.postscale_for(op, world.size));
    buf.copy_from_slice(out_block);
    scratch.put(Slot::Out, out);
    scratch.put(Slot::Scaled, scaled);
    Ok(())
}

fn in_place<T: Element>(
    comm: &mut ThreadComm,
    buf: &mut [T],
    call: Call,
    op: ReduceOp,
    scale: Scale,
) -> Result<(), TransportError> {
    let ThreadComm {
        world,
        rank,
        scratch,
        ..
    } = comm;
    let (size, rank) = (world.size, *rank);
    let block = block_len::<T>();
    let post = scale.postscale_for(op, size);
    let mut out = scratch.take::<T>(Slot::Out, block);
    let mut scaled = scratch.take::<T>(Slot::Scaled, 0);

    let mut round = Round::open(world, rank, Publication::new(call).in_place(buf))?;
    let mut reduce = RunReducer {
        rank,
        op,
        prescale: scale.prescale,
        post,
        out: &mut out,
        scaled: &mut scaled,
    };
    for range in blocks(round.schedule().chunk(rank), block) {
        round.in_place_with::<T, _>(range.clone(), |own, peers| reduce.run(own, peers))?;
        round.in_place_spread::<T>(range)?;
    }
    round.close()?;
    scratch.put(Slot::Out, out);
    scratch.put(Slot::Scaled, scaled);
    Ok(())
}

/// Rank counts up to which [`RunReducer::run`] lists the sources on the
/// stack.
const STACK_RANKS: usize = 8;

/// The in-place path's reduction of one block (or run) that this rank
/// owns, shared by `allreduce` and `allreduce_segments` so that both reduce
/// every element in the same order.
pub(crate) struct RunReducer<'a, T> {
    pub rank: usize,
    pub op: ReduceOp,
    pub prescale: f64,
    /// The factor of [`Scale::postscale_for`].
    pub post: f64,
    /// Scratch of at least one block.
    pub out: &'a mut [T],
    /// The prescaled copies of [`reduce_scaled`].
    pub scaled: &'a mut Vec<T>,
}

impl<T: Element> RunReducer<'_, T> {
    /// `own = post * op_r(prescale * x_r)` over `own` (this rank's
    /// elements) and `peers` (every other rank's, in rank order).
    #[inline]
    pub(crate) fn run(&mut self, own: &mut [T], peers: &[&[T]]) {
        match (peers, self.prescale) {
            // One rank: nothing to combine, only the scale factors (a
            // reduction over one source is the source itself).
            ([], prescale) if prescale != 1.0 => T::scale(own, prescale),
            ([], _) => {}
            // Two ranks: one combination per element, straight into the
            // own block (exact as in `reduce_many`).
            ([peer], 1.0) => T::reduce_into(own, peer, self.op),
            _ => self.run_many(own, peers),
        }
        if self.post != 1.0 {
            T::scale(own, self.post);
        }
    }

    /// [`RunReducer::run`] on more ranks, or with a prescale: in rank
    /// order into the scratch block (f16/bf16 accumulate in f32 and round
    /// once), then copied back.
    #[inline(never)]
    fn run_many(&mut self, own: &mut [T], peers: &[&[T]]) {
        let acc = &mut self.out[..own.len()];
        let rank = self.rank.min(peers.len());
        let mut on_stack: [&[T]; STACK_RANKS] = [&[]; STACK_RANKS];
        let on_heap: Vec<&[T]>;
        let srcs: &[&[T]] = if peers.len() < STACK_RANKS {
            on_stack[..rank].copy_from_slice(&peers[..rank]);
            on_stack[rank] = &*own;
            on_stack[rank + 1..=peers.len()].copy_from_slice(&peers[rank..]);
            &on_stack[..=peers.len()]
        } else {
            on_heap = peers[..rank]
                .iter()
                .copied()
                .chain(std::iter::once(&*own))
                .chain(peers[rank..].iter().copied())
                .collect();
            &on_heap
        };
        reduce_scaled(acc, srcs, self.op, self.prescale, self.scaled);
        own.copy_from_slice(acc);
    }
}

pub(crate) fn reduce_scatter<T: Element>(
    comm: &mut ThreadComm,
    send: &[T],
    recv: &mut [T],
    counts: &[usize],
    op: ReduceOp,
    scale: Scale,
) -> Result<(), TransportError> {
    let ThreadComm {
        world,
        rank,
        scratch,
        ..
    } = comm;
    let rank = *rank;
    let publication = Publication::new(Call::reduce::<T>(Kind::ReduceScatter, op, scale))
        .read_only(Buf::Send, send)
        .len_only(Buf::Recv, recv.len())
        .read_only(Buf::Counts, counts);
    let round = Round::open(world, rank, publication)?;
    // The verdict checked that every rank passed the same `size` counts,
    // that they add up to every send length, and that `recv` is block `rank`.
    let start: usize = counts.iter().take(rank).sum();
    let range = start..start + recv.len();
    let srcs = (0..world.size)
        .map(|peer| {
            round
                .view::<T>(peer, Buf::Send)?
                .get(range.clone())
                .ok_or_else(|| {
                    TransportError::Backend(format!(
                        "kolo-threads internal error: block {range:?} of rank {peer}"
                    ))
                })
        })
        .collect::<Result<Vec<_>, TransportError>>()?;
    let mut scaled = scratch.take::<T>(Slot::Scaled, 0);
    reduce_scaled(recv, &srcs, op, scale.prescale, &mut scaled);
    scratch.put(Slot::Scaled, scaled);
    drop(srcs);
    round.close()?;
    T::scale(recv, scale.postscale_for(op, world.size));
    Ok(())
}
