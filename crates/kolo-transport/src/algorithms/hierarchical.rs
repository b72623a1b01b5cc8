//! Hierarchical allreduce (Horovod's `HOROVOD_HIERARCHICAL_ALLREDUCE`):
//! the ranks of each host reduce-scatter the buffer among themselves (one
//! share per local rank), the ranks holding the same share on every host
//! allreduce it across hosts, and each host's ranks allgather the shares.
//! Only a rank's `1 / k` share crosses hosts (`k` ranks per host), so
//! each host sends `2 (h - 1) / h` of the buffer over its link (`h`
//! hosts), against `2 (n - 1) / n` for a flat ring over all `n = k h`
//! ranks, where each host has one ring edge to the next host: 1 against
//! 1.5 buffers for 2 hosts of 2, tending to half as many bytes with more
//! ranks per host, which is what counts where the link between hosts is
//! the bottleneck. The price is latency: three phases of `2 (k - 1) +
//! 2 (h - 1)` messages in all.
//!
//! Run one after the other, the phases would leave the link idle while
//! the hosts' rings work, and the flat ring, whose every step moves data
//! over the link and inside the hosts at once, would keep up (it did, on
//! 4 ranks sharing 2 busy cores behind a 1 Gbit/s link). So the buffer
//! goes in chunks of about 1 MiB through a software pipeline: at each
//! tick every chunk in flight takes its next ring step, and the tick's
//! exchanges go out together ([`Collectives::sendrecv_lanes`]), one
//! chunk's across hosts beside the others' inside them. A backend without
//! its own `sendrecv_lanes` runs them in turn: the same results, without
//! the overlap.
//!
//! The phases line up only where every host has the same number of ranks:
//! on uneven hosts, and where it would change nothing (one host, or one
//! rank per host), [`hierarchical_allreduce`] runs the flat generic
//! [`super::allreduce`] instead (see [`HostLayout::is_hierarchical`]).

use super::blocks::{split_send_recv, Blocks};
use super::ring_allgatherv::allgather_step;
use super::ring_reduce_scatter::reduce_scatter_step;
use super::HIERARCHICAL_TAG;
use crate::element::Element;
use crate::error::{Result, TransportError};
use crate::traits::{Collectives, Lane, Scale};
use kolo_protocol::ReduceOp;
use std::ops::Range;

/// Which ranks share a host, seen from one rank: its host's ranks and the
/// ranks at its local index on every host. Every rank builds it from the
/// same host keys, so all agree on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLayout {
    hosts: Vec<u64>,
    rank: usize,
    /// This rank's host's ranks, in rank order.
    local: Vec<usize>,
    /// The rank at this rank's local index on each host that has one,
    /// hosts in the order of their first rank.
    cross: Vec<usize>,
    /// Position of this rank in `local` and in `cross`.
    local_index: usize,
    cross_index: usize,
    host_count: usize,
    uniform: bool,
}

impl HostLayout {
    /// The layout of a communicator whose rank `r` runs on host `hosts[r]`
    /// (any key; equal keys mean the same host), seen from `rank`. Hosts
    /// need not hold consecutive ranks. `rank` out of range is an
    /// `InvalidArgument`.
    pub fn new(hosts: &[u64], rank: usize) -> Result<HostLayout> {
        let Some(&me) = hosts.get(rank) else {
            return Err(TransportError::InvalidArgument(format!(
                "host layout: rank {rank} of a layout of {} ranks",
                hosts.len()
            )));
        };
        // Each host's ranks, hosts in the order of their first rank.
        let mut groups: Vec<(u64, Vec<usize>)> = Vec::new();
        for (r, &host) in hosts.iter().enumerate() {
            match groups.iter_mut().find(|(h, _)| *h == host) {
                Some((_, ranks)) => ranks.push(r),
                None => groups.push((host, vec![r])),
            }
        }
        let local = groups
            .iter()
            .find(|(h, _)| *h == me)
            .map(|(_, ranks)| ranks.clone())
            .unwrap_or_default();
        let local_index = local.iter().position(|&r| r == rank).unwrap_or(0);
        let cross: Vec<usize> = groups
            .iter()
            .filter_map(|(_, ranks)| ranks.get(local_index).copied())
            .collect();
        let cross_index = cross.iter().position(|&r| r == rank).unwrap_or(0);
        let uniform = groups.iter().all(|(_, ranks)| ranks.len() == local.len());
        Ok(HostLayout {
            hosts: hosts.to_vec(),
            rank,
            local,
            cross,
            local_index,
            cross_index,
            host_count: groups.len(),
            uniform,
        })
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.hosts.len()
    }

    /// Number of hosts.
    pub fn host_count(&self) -> usize {
        self.host_count
    }

    /// This rank's host's ranks, in rank order.
    pub fn local_members(&self) -> &[usize] {
        &self.local
    }

    /// The ranks at this rank's local index, one per host that has one.
    pub fn cross_members(&self) -> &[usize] {
        &self.cross
    }

    /// True when every host holds the same number of ranks.
    pub fn is_uniform(&self) -> bool {
        self.uniform
    }

    /// True when [`hierarchical_allreduce`] runs its three phases: hosts
    /// of equal size, more than one host and more than one rank on each.
    /// Otherwise it is the flat allreduce.
    pub fn is_hierarchical(&self) -> bool {
        self.uniform && self.host_count > 1 && self.local.len() > 1
    }
}

/// In place, as [`super::allreduce`]: `buf = postscale' * op_r(prescale *
/// buf_r)` with `postscale'` of [`Scale::postscale_for`] over all ranks,
/// through the pipelined phases of the module docs where `layout`
/// [is hierarchical](HostLayout::is_hierarchical), else flat. Every rank
/// passes the same length and a layout built from the same host keys;
/// a layout of another size or rank than `comm` is an `InvalidArgument`.
///
/// Each element of the result is reduced and scaled by one rank and copied
/// to the others, so every rank ends with bitwise the same values (which
/// may differ in their last bits from the flat ring's, which sums floats
/// in another order).
pub fn hierarchical_allreduce<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    layout: &HostLayout,
    buf: &mut [T],
    op: ReduceOp,
    scale: Scale,
) -> Result<()> {
    const OP: &str = "hierarchical allreduce";
    if (layout.size(), layout.rank) != (comm.size(), comm.rank()) {
        return Err(TransportError::InvalidArgument(format!(
            "{OP}: the host layout of rank {} of {} on rank {} of {}",
            layout.rank,
            layout.size(),
            comm.rank(),
            comm.size()
        )));
    }
    if !layout.is_hierarchical() {
        return super::allreduce(comm, buf, op, scale);
    }
    T::scale(buf, scale.prescale);
    pipeline(comm, layout, buf, op, scale.postscale_for(op, comm.size()))
}

/// A chunk of the pipeline is about this many bytes, so that a buffer of
/// several MiB keeps both rings busy at once: the host's rings on one
/// chunk while the link carries another.
const CHUNK_BYTES: usize = 1 << 20;

/// At most this many chunks: every tick of the pipeline waits for all of
/// its exchanges, and each tick past the fill costs its latency.
const MAX_CHUNKS: usize = 16;

/// Where a chunk stands among its `2 (k - 1) + 2 (h - 1)` ring steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    LocalReduceScatter(usize),
    CrossReduceScatter(usize),
    CrossAllgather(usize),
    LocalAllgather(usize),
}

/// The stage of step `step` with `k` ranks per host and `h` hosts.
fn stage(step: usize, k: usize, h: usize) -> Stage {
    let (local, cross) = (k - 1, h - 1);
    if step < local {
        Stage::LocalReduceScatter(step)
    } else if step < local + cross {
        Stage::CrossReduceScatter(step - local)
    } else if step < local + 2 * cross {
        Stage::CrossAllgather(step - local - cross)
    } else {
        Stage::LocalAllgather(step - local - 2 * cross)
    }
}

/// The three phases over chunks of `buf` (already prescaled), as a
/// software pipeline: chunk `c` takes its step `t - c` at tick `t`, and all
/// the exchanges of a tick go out together through
/// [`Collectives::sendrecv_lanes`], so that a chunk's exchanges across
/// hosts travel while other chunks' move inside the hosts. The reduced
/// piece of each chunk is scaled by `postscale` once, by its owner,
/// before it is gathered.
fn pipeline<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    layout: &HostLayout,
    buf: &mut [T],
    op: ReduceOp,
    postscale: f64,
) -> Result<()> {
    let (k, h) = (layout.local.len(), layout.cross.len());
    let (li, ci) = (layout.local_index, layout.cross_index);
    let steps = 2 * (k - 1) + 2 * (h - 1);
    let count = (std::mem::size_of_val(buf) / CHUNK_BYTES).clamp(1, MAX_CHUNKS);
    let bounds = Blocks::even(buf.len(), count);
    let mut chunks: Vec<&mut [T]> = Vec::with_capacity(count);
    let mut rest = buf;
    for c in 0..count {
        let (chunk, tail) = rest.split_at_mut(bounds.range(c).len());
        chunks.push(chunk);
        rest = tail;
    }
    let shares: Vec<Blocks> = chunks.iter().map(|c| Blocks::even(c.len(), k)).collect();
    let pieces: Vec<Blocks> = shares
        .iter()
        .map(|s| Blocks::even(s.range(li).len(), h))
        .collect();
    // A piece of chunk `c`'s share, as a range of the chunk.
    let in_share = |c: usize, piece: usize| {
        let (start, r) = (shares[c].range(li).start, pieces[c].range(piece));
        start + r.start..start + r.end
    };
    let mut incoming: Vec<Vec<T>> = vec![Vec::new(); count];
    let local = (layout.local[(li + 1) % k], layout.local[(li + k - 1) % k]);
    let cross = (layout.cross[(ci + 1) % h], layout.cross[(ci + h - 1) % h]);
    for tick in 0..count + steps - 1 {
        let first = (tick + 1).saturating_sub(steps);
        let last = tick.min(count - 1);
        // Received blocks to fold in once the tick's exchanges are done.
        let mut folds: Vec<(usize, Range<usize>)> = Vec::new();
        let mut lanes: Vec<Lane<'_, T>> = Vec::with_capacity(last + 1 - first);
        let active = chunks.iter_mut().zip(incoming.iter_mut()).enumerate();
        for (c, (chunk, scratch)) in active.skip(first).take(last + 1 - first) {
            let (send, into, (dst, src)) = match stage(tick - c, k, h) {
                Stage::LocalReduceScatter(s) => {
                    let (out, into) = reduce_scatter_step(li, s, k);
                    (shares[c].range(out), shares[c].range(into), local)
                }
                Stage::CrossReduceScatter(s) => {
                    let (out, into) = reduce_scatter_step(ci, s, h);
                    (in_share(c, out), in_share(c, into), cross)
                }
                Stage::CrossAllgather(s) => {
                    let (out, into) = allgather_step(ci, s, h);
                    (in_share(c, out), in_share(c, into), cross)
                }
                Stage::LocalAllgather(s) => {
                    let (out, into) = allgather_step(li, s, k);
                    (shares[c].range(out), shares[c].range(into), local)
                }
            };
            let tag = HIERARCHICAL_TAG;
            let reduces = matches!(
                stage(tick - c, k, h),
                Stage::LocalReduceScatter(_) | Stage::CrossReduceScatter(_)
            );
            if reduces {
                scratch.resize(scratch.len().max(into.len()), T::default());
                let recv = &mut scratch[..into.len()];
                folds.push((c, into));
                let send = &chunk[send];
                lanes.push(Lane {
                    send,
                    dst,
                    recv,
                    src,
                    tag,
                });
            } else {
                let (send, recv) = split_send_recv(chunk, send, into);
                lanes.push(Lane {
                    send,
                    dst,
                    recv,
                    src,
                    tag,
                });
            }
        }
        comm.sendrecv_lanes(&mut lanes)?;
        drop(lanes);
        for (c, into) in folds {
            let len = into.len();
            T::reduce_into(&mut chunks[c][into], &incoming[c][..len], op);
        }
        // A chunk whose last reduce-scatter step across hosts was this
        // tick's holds its piece reduced over every rank.
        let reduced = (first..=last).find(|&c| tick - c == k + h - 3);
        if let Some(c) = reduced {
            T::scale(&mut chunks[c][in_share(c, ci)], postscale);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_stages_follow_one_another() {
        // 3 ranks per host, 2 hosts: 2 (3 - 1) + 2 (2 - 1) steps.
        let stages: Vec<Stage> = (0..6).map(|step| stage(step, 3, 2)).collect();
        assert_eq!(
            stages,
            [
                Stage::LocalReduceScatter(0),
                Stage::LocalReduceScatter(1),
                Stage::CrossReduceScatter(0),
                Stage::CrossAllgather(0),
                Stage::LocalAllgather(0),
                Stage::LocalAllgather(1),
            ]
        );
    }

    #[test]
    fn two_hosts_of_two() {
        let layout = HostLayout::new(&[0, 0, 2, 2], 3).unwrap();
        assert_eq!(layout.local_members(), [2, 3]);
        assert_eq!(layout.cross_members(), [1, 3]);
        assert_eq!((layout.local_index, layout.cross_index), (1, 1));
        assert!(layout.is_hierarchical());
    }

    #[test]
    fn hosts_need_not_hold_consecutive_ranks() {
        let layout = HostLayout::new(&[7, 3, 7, 3, 7, 3], 4).unwrap();
        assert_eq!(layout.local_members(), [0, 2, 4]);
        assert_eq!(layout.cross_members(), [4, 5]);
        assert!(layout.is_hierarchical());
    }

    #[test]
    fn flat_where_the_phases_change_nothing_or_do_not_line_up() {
        let flat = |hosts: &[u64]| !HostLayout::new(hosts, 0).unwrap().is_hierarchical();
        assert!(flat(&[0, 0, 0, 0]), "one host");
        assert!(flat(&[0, 1, 2, 3]), "one rank per host");
        assert!(flat(&[0, 0, 0, 3]), "uneven hosts");
        assert!(flat(&[5]), "one rank");
        assert!(HostLayout::new(&[0, 0], 2).is_err());
    }

    proptest! {
        /// Over any layout: the local members share this rank's host, the
        /// cross members one per host at this rank's local index, and the
        /// members of the phases partition the ranks on a uniform layout.
        #[test]
        fn members_follow_the_hosts(hosts in prop::collection::vec(0u64..4, 1..24), pick in 0usize..24) {
            let rank = pick % hosts.len();
            let layout = HostLayout::new(&hosts, rank).unwrap();
            prop_assert!(layout.local_members().iter().all(|&r| hosts[r] == hosts[rank]));
            prop_assert_eq!(layout.local_members()[layout.local_index], rank);
            prop_assert_eq!(layout.cross_members()[layout.cross_index], rank);
            let mut seen: Vec<u64> = layout.cross_members().iter().map(|&r| hosts[r]).collect();
            seen.sort_unstable();
            seen.dedup();
            prop_assert_eq!(seen.len(), layout.cross_members().len(), "one per host");
            for &r in layout.cross_members() {
                let theirs = HostLayout::new(&hosts, r).unwrap();
                prop_assert_eq!(theirs.local_index, layout.local_index);
                prop_assert_eq!(theirs.cross_members(), layout.cross_members());
            }
            if layout.is_uniform() {
                prop_assert_eq!(layout.cross_members().len(), layout.host_count());
                prop_assert_eq!(layout.local_members().len() * layout.host_count(), hosts.len());
            }
        }
    }
}
