//! Allreduce over several rails: communicators that join the same ranks
//! in the same order, each with its own connections (a backend's second
//! worker, say). The buffer is cut into one part per rail and each part
//! goes through the generic [`super::allreduce`] on its rail, every rail
//! on a thread of its own, so that transports whose cost is a core's
//! copying (TCP: every byte goes through a `send` and a `recv` system
//! call) move the parts side by side on as many cores.
//!
//! [`rail_allreduce`] starts a scoped thread per call and rail (tens of
//! microseconds, more on a virtual machine): the plain form, for any
//! number of rails. A backend's hot path keeps its second rail on a
//! persistent thread instead ([`super::RailThread`] and
//! [`super::threaded_rail_allreduce`], the same cut into two parts).

use crate::element::Element;
use crate::error::{Result, TransportError};
use crate::traits::{Collectives, Scale};
use kolo_protocol::ReduceOp;

/// Parts start at multiples of this many bytes, so that no two threads
/// write the same cache line.
const PART_ALIGN_BYTES: usize = 64;

/// The element range of each of `rails` parts of `len` elements of
/// `size` bytes: equal parts rounded up to [`PART_ALIGN_BYTES`], the last
/// one shorter (and trailing ones empty where the buffer is short). Every
/// rank computes the same cut from the same length.
pub fn rail_parts(len: usize, size: usize, rails: usize) -> Vec<std::ops::Range<usize>> {
    let rails = rails.max(1);
    let align = (PART_ALIGN_BYTES / size.max(1)).max(1);
    let part = len.div_ceil(rails).div_ceil(align) * align;
    (0..rails)
        .map(|r| {
            let start = (r * part).min(len);
            start..(start + part).min(len)
        })
        .collect()
}

/// In place, as [`super::allreduce`], over `rails` (communicators of the
/// same ranks, in the same order; the first is run on the calling thread,
/// each other one on a thread of its own): part `r` of `buf` (see
/// [`rail_parts`]) is reduced over rail `r`. Every rank passes the same
/// length and its rails in the same order. Each element is reduced by the
/// generic allreduce of one rail, so every rank ends with bitwise the same
/// values. The first error of a rail is returned, after every rail ended.
pub fn rail_allreduce<C: Collectives + Send, T: Element>(
    rails: &mut [C],
    buf: &mut [T],
    op: ReduceOp,
    scale: Scale,
) -> Result<()> {
    let Some((first, others)) = rails.split_first_mut() else {
        return Err(TransportError::InvalidArgument(
            "rail allreduce: no rail to reduce over".into(),
        ));
    };
    let ranks = (first.rank(), first.size());
    if let Some(other) = others.iter().find(|c| (c.rank(), c.size()) != ranks) {
        return Err(TransportError::InvalidArgument(format!(
            "rail allreduce: a rail of rank {} of {} beside one of rank {} of {}",
            other.rank(),
            other.size(),
            ranks.0,
            ranks.1
        )));
    }
    let parts = rail_parts(buf.len(), std::mem::size_of::<T>(), others.len() + 1);
    let mut pieces: Vec<&mut [T]> = Vec::with_capacity(parts.len());
    let mut rest = buf;
    for part in &parts {
        let (piece, tail) = rest.split_at_mut(part.len());
        pieces.push(piece);
        rest = tail;
    }
    let mut pieces = pieces.into_iter();
    let mine = pieces.next().unwrap_or_default();
    std::thread::scope(|s| {
        let threads: Vec<_> = others
            .iter_mut()
            .zip(pieces)
            .map(|(rail, piece)| s.spawn(move || super::allreduce(rail, piece, op, scale)))
            .collect();
        let here = super::allreduce(first, mine, op, scale);
        let there = threads.into_iter().map(|t| {
            t.join().unwrap_or_else(|_| {
                Err(TransportError::Backend(
                    "rail allreduce: a rail's thread panicked".into(),
                ))
            })
        });
        let outcomes: Vec<Result<()>> = std::iter::once(here).chain(there).collect();
        outcomes.into_iter().collect::<Result<()>>()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The parts tile the buffer in order, start on aligned bytes and
        /// differ in length by at most one alignment unit (but the last).
        #[test]
        fn parts_tile_the_buffer(len in 0usize..100_000, size in prop::sample::select(vec![1usize, 2, 4, 8]), rails in 1usize..5) {
            let parts = rail_parts(len, size, rails);
            prop_assert_eq!(parts.len(), rails);
            let align = PART_ALIGN_BYTES / size;
            let mut next = 0;
            for part in &parts {
                prop_assert_eq!(part.start, next);
                prop_assert!(part.start == len || part.start % align == 0);
                next = part.end;
            }
            prop_assert_eq!(next, len);
            prop_assert!(parts[0].len() < len.div_ceil(rails) + align);
        }
    }
}
