//! The collectives that only move data: allgatherv, broadcast, alltoallv.
//! Each rank copies straight from the peers' published send buffers into
//! its own receive buffer, which no peer touches.

use crate::call::{Call, Kind};
use crate::shared::{internal, Buf, Publication, Round};
use crate::world::World;
use kolo_transport::{Element, TransportError};

/// Copies `src` into `dst[start..start + src.len()]`.
fn copy_at<T: Copy>(dst: &mut [T], start: usize, src: &[T]) -> Result<(), TransportError> {
    let len = dst.len();
    dst.get_mut(start..start + src.len())
        .ok_or_else(|| internal(format!("{} elements at {start} of {len}", src.len())))?
        .copy_from_slice(src);
    Ok(())
}

/// The offset of block `index` in a buffer of blocks of `counts`.
fn offset(counts: &[usize], index: usize) -> usize {
    counts.iter().take(index).sum()
}

pub(crate) fn allgatherv<T: Element>(
    world: &World,
    rank: usize,
    send: &[T],
    recv: &mut [T],
    counts: &[usize],
) -> Result<(), TransportError> {
    let publication = Publication::new(Call::of::<T>(Kind::Allgatherv))
        .read_only(Buf::Send, send)
        .len_only(Buf::Recv, recv.len())
        .read_only(Buf::Counts, counts);
    let round = Round::open(world, rank, publication)?;
    // Start with the next rank so that the ranks spread their reads.
    for step in 0..world.size {
        let peer = (rank + step) % world.size;
        copy_at(
            recv,
            offset(counts, peer),
            round.view::<T>(peer, Buf::Send)?,
        )?;
    }
    round.close()
}

pub(crate) fn broadcast<T: Element>(
    world: &World,
    rank: usize,
    buf: &mut [T],
    root: usize,
) -> Result<(), TransportError> {
    let call = Call::of::<T>(Kind::Broadcast).rooted(root);
    if rank == root {
        Round::open(
            world,
            rank,
            Publication::new(call).read_only(Buf::Send, &*buf),
        )?
        .close()
    } else {
        let round = Round::open(
            world,
            rank,
            Publication::new(call).len_only(Buf::Send, buf.len()),
        )?;
        copy_at(buf, 0, round.view::<T>(root, Buf::Send)?)?;
        round.close()
    }
}

pub(crate) fn alltoallv<T: Element>(
    world: &World,
    rank: usize,
    send: &[T],
    send_counts: &[usize],
    recv: &mut [T],
    recv_counts: &[usize],
) -> Result<(), TransportError> {
    let publication = Publication::new(Call::of::<T>(Kind::Alltoallv))
        .read_only(Buf::Send, send)
        .len_only(Buf::Recv, recv.len())
        .read_only(Buf::Counts, send_counts)
        .read_only(Buf::RecvCounts, recv_counts);
    let round = Round::open(world, rank, publication)?;
    for step in 0..world.size {
        let peer = (rank + step) % world.size;
        let peer_counts = round.view::<usize>(peer, Buf::Counts)?;
        let start = offset(peer_counts, rank);
        let count = peer_counts.get(rank).copied().unwrap_or(0);
        let block = round
            .view::<T>(peer, Buf::Send)?
            .get(start..start + count)
            .ok_or_else(|| internal(format!("block for rank {rank} of rank {peer}")))?;
        copy_at(recv, offset(recv_counts, peer), block)?;
    }
    round.close()
}
