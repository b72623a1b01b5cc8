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
//! The phases line up only where every host has the same number of ranks:
//! on uneven hosts, and where it would change nothing (one host, or one
//! rank per host), [`hierarchical_allreduce`] runs the flat generic
//! [`super::allreduce`] instead (see [`HostLayout::is_hierarchical`]).

use super::blocks::Blocks;
use super::ring_allgatherv::allgather_in_place;
use super::ring_reduce_scatter::reduce_scatter_in_place;
use super::subset::Subset;
use super::HIERARCHICAL_TAG;
use crate::element::Element;
use crate::error::{Result, TransportError};
use crate::traits::{Collectives, Scale};
use kolo_protocol::ReduceOp;

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
/// through the three phases of the module docs where `layout`
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
    let n = comm.size();
    T::scale(buf, scale.prescale);
    let shares = Blocks::even(buf.len(), layout.local.len());
    // Each phase's view lives only as long as the phase: the next one
    // borrows `comm` anew.
    let mut local = Subset::new(&mut *comm, &layout.local, &layout.hosts)?;
    reduce_scatter_in_place(&mut local, buf, &shares, op, HIERARCHICAL_TAG)?;
    let share = &mut buf[shares.range(layout.local_index)];
    let mut cross = Subset::new(&mut *comm, &layout.cross, &layout.hosts)?;
    let pieces = Blocks::even(share.len(), layout.cross.len());
    reduce_scatter_in_place(&mut cross, share, &pieces, op, HIERARCHICAL_TAG)?;
    T::scale(
        &mut share[pieces.range(layout.cross_index)],
        scale.postscale_for(op, n),
    );
    allgather_in_place(&mut cross, share, &pieces, HIERARCHICAL_TAG)?;
    let mut local = Subset::new(comm, &layout.local, &layout.hosts)?;
    allgather_in_place(&mut local, buf, &shares, HIERARCHICAL_TAG)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
