//! [`Subset`]: some ranks of a communicator seen as a communicator of their
//! own, so that every generic algorithm runs among them unchanged.

use super::blocks::check_rank;
use crate::element::Element;
use crate::error::{Result, TransportError};
use crate::traits::{Collectives, Lane, MemoryKind, Topology};

/// The ranks `members` of `comm` as a communicator: rank `i` of the view
/// is rank `members[i]` of `comm`, and `send` / `recv` / `sendrecv` to a
/// view rank go to its rank in `comm` with the same tag. Every collective
/// of the view is then a generic algorithm of this module over those ranks
/// alone (the others take no part). Messages keep the parent's pairs and
/// tags, so a view must not run a collective while its parent runs one
/// with the same tag among the same pairs: callers give each phase its own
/// tag or ranks, as [`super::hierarchical_allreduce`] does.
///
/// Its local rank and size count the members on this rank's host, given
/// one host key per rank of `comm` (equal keys: the same host).
#[derive(Debug)]
pub struct Subset<'a, C: ?Sized> {
    comm: &'a mut C,
    members: &'a [usize],
    rank: usize,
    local_rank: usize,
    local_size: usize,
}

impl<'a, C: Topology + ?Sized> Subset<'a, C> {
    /// The view of `members` (distinct ranks of `comm`, this rank among
    /// them) with `hosts[r]` the host of rank `r` of `comm`. Anything else
    /// is an `InvalidArgument` naming the value.
    pub fn new(comm: &'a mut C, members: &'a [usize], hosts: &[u64]) -> Result<Self> {
        const OP: &str = "subset";
        let (size, me) = (comm.size(), comm.rank());
        if hosts.len() != size {
            return Err(TransportError::InvalidArgument(format!(
                "{OP}: {} host keys for a communicator of {size} ranks",
                hosts.len()
            )));
        }
        let mut seen = vec![false; size];
        for &member in members {
            check_rank(OP, "member", member, size)?;
            if std::mem::replace(&mut seen[member], true) {
                return Err(TransportError::InvalidArgument(format!(
                    "{OP}: rank {member} is listed twice"
                )));
            }
        }
        let Some(rank) = members.iter().position(|&m| m == me) else {
            return Err(TransportError::InvalidArgument(format!(
                "{OP}: rank {me} is not among the members {members:?}"
            )));
        };
        let mine = |&m: &usize| hosts[m] == hosts[me];
        let local_rank = members[..rank].iter().filter(|m| mine(m)).count();
        let local_size = members.iter().filter(|m| mine(m)).count();
        Ok(Subset {
            comm,
            members,
            rank,
            local_rank,
            local_size,
        })
    }

    /// The rank in the parent communicator of view rank `peer`.
    fn parent(&self, peer: usize) -> Result<usize> {
        check_rank("subset", "peer", peer, self.members.len())?;
        Ok(self.members[peer])
    }
}

impl<C: ?Sized> Topology for Subset<'_, C> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.members.len()
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn local_size(&self) -> usize {
        self.local_size
    }
}

/// Only point-to-point is forwarded: the collectives are the generic
/// algorithms over the view (the parent's own, native ones would run over
/// all its ranks).
impl<C: Collectives + ?Sized> Collectives for Subset<'_, C> {
    fn memory(&self) -> MemoryKind {
        self.comm.memory()
    }
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        let peer = self.parent(peer)?;
        self.comm.send(buf, peer, tag)
    }
    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        let peer = self.parent(peer)?;
        self.comm.recv(buf, peer, tag)
    }
    fn sendrecv<T: Element>(
        &mut self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
        tag: u32,
    ) -> Result<()> {
        let (dst, src) = (self.parent(dst)?, self.parent(src)?);
        self.comm.sendrecv(send, dst, recv, src, tag)
    }
    fn sendrecv_lanes<T: Element>(&mut self, lanes: &mut [Lane<'_, T>]) -> Result<()> {
        let mut parents = Vec::with_capacity(lanes.len());
        for lane in lanes.iter_mut() {
            parents.push(Lane {
                send: lane.send,
                dst: self.parent(lane.dst)?,
                recv: &mut *lane.recv,
                src: self.parent(lane.src)?,
                tag: lane.tag,
            });
        }
        self.comm.sendrecv_lanes(&mut parents)
    }
}
