//! The two planes (DESIGN.md): the control plane moves small host byte
//! messages for negotiation; the data plane moves tensors.

use crate::element::Element;
use crate::error::Result;
use crate::transaction::Transaction;
use kolo_protocol::ReduceOp;

/// Bitwise reduction for [`Controller::bitwise_allreduce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitOp {
    /// Bit set on every rank.
    And,
    /// Bit set on any rank.
    Or,
}

/// Which memory a backend's data plane reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host (CPU) memory.
    Host,
    /// CUDA device memory.
    Cuda,
}

/// Factors applied around a reduction: `out = postscale * reduce(prescale * in_r)`.
/// `ReduceOp::Average` folds `1 / size` into the postscale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    /// Applied to every rank's input before the reduction.
    pub prescale: f64,
    /// Applied to the reduced result.
    pub postscale: f64,
}

impl Scale {
    /// No scaling: both factors 1.
    pub const NONE: Scale = Scale {
        prescale: 1.0,
        postscale: 1.0,
    };

    /// True when both factors are exactly 1.
    pub fn is_identity(&self) -> bool {
        self.prescale == 1.0 && self.postscale == 1.0
    }

    /// The factor to apply to the reduced result of `op` over `size` ranks:
    /// `postscale`, divided by `size` for [`ReduceOp::Average`]. Applied
    /// once with [`Element::scale`], so integer averages are "wrapping sum,
    /// times `postscale / size` in f64, rounded toward zero". Every backend
    /// uses this one function so that integer results agree bit for bit.
    pub fn postscale_for(&self, op: ReduceOp, size: usize) -> f64 {
        match op {
            ReduceOp::Average => self.postscale / size.max(1) as f64,
            _ => self.postscale,
        }
    }
}

impl Default for Scale {
    fn default() -> Self {
        Scale::NONE
    }
}

/// Where this rank stands in its communicator; shared by both planes.
pub trait Topology {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the communicator.
    fn size(&self) -> usize;
    /// Rank among the ranks of this host.
    fn local_rank(&self) -> usize;
    /// Number of ranks on this host.
    fn local_size(&self) -> usize;
}

/// The control plane: small host-memory messages between all ranks of a
/// communicator. Every rank must make the same calls in the same order.
pub trait Controller: Topology {
    /// Gathers every rank's message at `root`: `Some(messages in rank order)`
    /// on the root, `None` elsewhere.
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>>;
    /// The root's `msg` is returned on every rank (the other ranks' `msg` is
    /// ignored).
    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>>;
    /// Every rank's message, in rank order, on every rank.
    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Returns once every rank has entered.
    fn control_barrier(&mut self) -> Result<()>;
    /// In-place bitwise AND / OR of `words` across ranks (the response
    /// cache's fast path). Every rank passes the same length.
    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()>;
}

/// The data plane on host memory. Every rank must make the same collective
/// calls in the same order with compatible arguments; arguments that cannot
/// match (lengths) are reported as [`crate::TransportError::InvalidArgument`]
/// where a rank can see it locally.
///
/// Only `send` and `recv` are required: every collective has a default
/// written once in [`crate::algorithms`] against point-to-point messages
/// (ring allreduce, ring allgatherv, binomial-tree broadcast, pairwise
/// alltoallv, ...), so a point-to-point backend gets them all. Backends with
/// native or shared-memory collectives override them.
///
/// Counts are in elements, never bytes.
pub trait Collectives: Topology {
    /// Which memory the buffers live in.
    fn memory(&self) -> MemoryKind {
        MemoryKind::Host
    }

    /// Sends `buf` to `peer` with `tag`. Messages between one pair with one
    /// tag arrive in the order sent. User tags must be below
    /// [`crate::RESERVED_TAG_BASE`]: the tags above it belong to the generic
    /// algorithms and to backends' internal messages.
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()>;

    /// Receives exactly `buf.len()` elements from `peer` with `tag`; a message
    /// of another length is an `InvalidArgument` error naming both lengths.
    /// User tags must be below [`crate::RESERVED_TAG_BASE`].
    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()>;

    /// Sends `send` to `dst` and receives `recv` from `src` without
    /// deadlocking when every rank does the same (the exchange step of ring
    /// algorithms). The default sends first, which is correct for backends
    /// whose `send` does not wait for the receiver; others override it.
    fn sendrecv<T: Element>(
        &mut self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
        tag: u32,
    ) -> Result<()> {
        self.send(send, dst, tag)?;
        self.recv(recv, src, tag)
    }

    /// In place: `buf = postscale * op_r(prescale * buf_r)`. `Average`
    /// divides the sum by `size` (see [`Scale::postscale_for`] and
    /// [`Element::scale`] for integers).
    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()>
    where
        Self: Sized,
    {
        crate::algorithms::ring_allreduce(self, buf, op, scale)
    }

    /// True when [`Collectives::allreduce_segments`] reduces the segments
    /// where they lie, as one collective with one synchronisation: callers
    /// that would otherwise pack several tensors into a fusion buffer
    /// (kolo-fusion) should hand them over as segments instead and skip
    /// the two copies. The default is `false`: the default
    /// `allreduce_segments` runs one allreduce per segment, so packing is
    /// faster there.
    fn reduces_segments_in_place(&self) -> bool {
        false
    }

    /// In place, as one collective: allreduces `segments` as if they were
    /// concatenated in order into one buffer and reduced with
    /// [`Collectives::allreduce`] (same `op` and `scale` semantics; element
    /// `i` of segment `s` is reduced with element `i` of every rank's
    /// segment `s`). Every rank passes the same number of segments with
    /// the same lengths (as every rank of a fused response does); zero
    /// segments and empty segments are allowed.
    ///
    /// The default runs one [`Collectives::allreduce`] per segment, in
    /// order: correct on every backend, but one synchronisation per
    /// segment. Backends that can reduce scattered memory natively override
    /// it together with [`Collectives::reduces_segments_in_place`].
    fn allreduce_segments<T: Element>(
        &mut self,
        segments: &mut [&mut [T]],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()>
    where
        Self: Sized,
    {
        for segment in segments.iter_mut() {
            self.allreduce(segment, op, scale)?;
        }
        Ok(())
    }

    /// Concatenates every rank's `send` in rank order into `recv`.
    /// `counts[r]` is rank r's element count; `send.len() == counts[rank]`
    /// and `recv.len() == sum(counts)`.
    fn allgatherv<T: Element>(&mut self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()>
    where
        Self: Sized,
    {
        crate::algorithms::ring_allgatherv(self, send, recv, counts)
    }

    /// The root's `buf` is copied into every rank's `buf`.
    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()>
    where
        Self: Sized,
    {
        crate::algorithms::tree_broadcast(self, buf, root)
    }

    /// Reduces every rank's `send` (length `sum(counts)`, same on all ranks)
    /// and leaves block `rank` (offset `sum(counts[..rank])`, length
    /// `counts[rank]`) in `recv`, scaled as in `allreduce`.
    fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()>
    where
        Self: Sized,
    {
        crate::algorithms::ring_reduce_scatter(self, send, recv, counts, op, scale)
    }

    /// `send` holds `send_counts[p]` elements for each peer p, peer after
    /// peer; `recv` receives `recv_counts[p]` from each peer p, in peer order.
    fn alltoallv<T: Element>(
        &mut self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()>
    where
        Self: Sized,
    {
        crate::algorithms::pairwise_alltoallv(self, send, send_counts, recv, recv_counts)
    }

    /// Returns once every rank has entered.
    fn barrier(&mut self) -> Result<()>
    where
        Self: Sized,
    {
        crate::algorithms::dissemination_barrier(self)
    }

    /// Runs every operation of `tx` as one group: collectives run in the
    /// order scheduled; sends and receives may be matched in any order
    /// without deadlock on backends that issue the group natively (NCCL,
    /// MPI's non-blocking calls) or buffer their sends (kolo-threads). The
    /// default, [`Transaction::run_default`], guarantees that only for
    /// exchanges of paired sends and receives; see its documentation.
    fn execute<T: Element>(&mut self, tx: Transaction<'_, T>) -> Result<()>
    where
        Self: Sized,
    {
        tx.run_default(self)
    }
}

/// A complete backend: control plane and host data plane.
pub trait Backend: Controller + Collectives {}
impl<B: Controller + Collectives> Backend for B {}
