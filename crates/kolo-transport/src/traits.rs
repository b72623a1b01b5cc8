//! The two planes (DESIGN.md): the control plane moves small host byte
//! messages for negotiation; the data plane moves tensors.

use crate::element::Element;
use crate::error::Result;
use crate::memory::{Host, Memory};
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

/// One exchange of [`Collectives::sendrecv_lanes`]: `send` goes to `dst`
/// and `recv` is filled from `src`, both with `tag`.
#[derive(Debug)]
pub struct Lane<'a, T: Element, M: Memory = Host> {
    /// What this rank sends.
    pub send: M::Ref<'a, T>,
    /// The rank it goes to.
    pub dst: usize,
    /// Where the message from `src` goes (its length is the message's).
    pub recv: M::Mut<'a, T>,
    /// The rank it comes from.
    pub src: usize,
    /// The tag of both messages.
    pub tag: u32,
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

/// The data plane on memory `M` (host memory unless said otherwise: a
/// backend of device memory implements `Collectives<ItsMemory>`). Every
/// rank must make the same collective calls in the same order with
/// compatible arguments; arguments that cannot match (lengths) are
/// reported as [`crate::TransportError::InvalidArgument`] where a rank can
/// see it locally.
///
/// Only `send` and `recv` are required: on host memory every collective
/// has a default written once in [`crate::algorithms`] against
/// point-to-point messages (ring allreduce, ring allgatherv,
/// binomial-tree broadcast, pairwise alltoallv, ...), so a point-to-point
/// backend gets them all; backends with native or shared-memory
/// collectives override them. A device memory's defaults fail (see
/// [`Memory`]): its backend implements every collective.
///
/// Operations are ordered: each one takes effect after the ones this rank
/// called before it. Host backends complete an operation before they
/// return; a device backend may return once the operation is queued in
/// its stream's order, and [`Collectives::synchronize`] waits for it (and
/// reports an asynchronous failure).
///
/// Buffers are `M`'s views: `M::Ref<'_, T>` to read (`&[T]` on the host),
/// `M::Mut<'_, T>` to write (`&mut [T]`). Counts are in elements, never
/// bytes.
pub trait Collectives<M: Memory = Host>: Topology {
    /// Which memory the buffers live in.
    fn memory(&self) -> MemoryKind {
        M::KIND
    }

    /// Sends `buf` to `peer` with `tag`. Messages between one pair with one
    /// tag arrive in the order sent. User tags must be below
    /// [`crate::RESERVED_TAG_BASE`]: the tags above it belong to the generic
    /// algorithms and to backends' internal messages.
    fn send<T: Element>(&mut self, buf: M::Ref<'_, T>, peer: usize, tag: u32) -> Result<()>;

    /// Receives exactly `buf`'s length of elements from `peer` with `tag`;
    /// a message of another length is an `InvalidArgument` error naming
    /// both lengths. User tags must be below [`crate::RESERVED_TAG_BASE`].
    fn recv<T: Element>(&mut self, buf: M::Mut<'_, T>, peer: usize, tag: u32) -> Result<()>;

    /// Sends `send` to `dst` and receives `recv` from `src` without
    /// deadlocking when every rank does the same (the exchange step of ring
    /// algorithms). The default sends first, which is correct for backends
    /// whose `send` does not wait for the receiver; others override it.
    fn sendrecv<T: Element>(
        &mut self,
        send: M::Ref<'_, T>,
        dst: usize,
        recv: M::Mut<'_, T>,
        src: usize,
        tag: u32,
    ) -> Result<()> {
        self.send(send, dst, tag)?;
        self.recv(recv, src, tag)
    }

    /// Several [`Collectives::sendrecv`] exchanges at once, for algorithms
    /// that keep more than one ring busy (the hierarchical allreduce's
    /// pipeline: a host's ring beside the ring across hosts). Every rank
    /// passes its lanes in the same order of exchanges; two lanes between
    /// one pair with one tag are matched in that order. The default runs
    /// the lanes one after the other, which cannot deadlock where each
    /// lane is an exchange every rank makes at the same position;
    /// backends that can keep several messages in flight override it.
    fn sendrecv_lanes<T: Element>(&mut self, lanes: &mut [Lane<'_, T, M>]) -> Result<()> {
        for lane in lanes.iter_mut() {
            let recv = M::reborrow(&mut lane.recv);
            self.sendrecv(lane.send, lane.dst, recv, lane.src, lane.tag)?;
        }
        Ok(())
    }

    /// In place: `buf = postscale * op_r(prescale * buf_r)`. `Average`
    /// divides the sum by `size` (see [`Scale::postscale_for`] and
    /// [`Element::scale`] for integers).
    fn allreduce<T: Element>(
        &mut self,
        buf: M::Mut<'_, T>,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()>
    where
        Self: Sized,
    {
        M::allreduce(self, buf, op, scale)
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
        segments: &mut [M::Mut<'_, T>],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()>
    where
        Self: Sized,
    {
        for segment in segments.iter_mut() {
            self.allreduce(M::reborrow(segment), op, scale)?;
        }
        Ok(())
    }

    /// Concatenates every rank's `send` in rank order into `recv`.
    /// `counts[r]` is rank r's element count; `send` holds `counts[rank]`
    /// elements and `recv` `sum(counts)`.
    fn allgatherv<T: Element>(
        &mut self,
        send: M::Ref<'_, T>,
        recv: M::Mut<'_, T>,
        counts: &[usize],
    ) -> Result<()>
    where
        Self: Sized,
    {
        M::allgatherv(self, send, recv, counts)
    }

    /// The root's `buf` is copied into every rank's `buf`.
    fn broadcast<T: Element>(&mut self, buf: M::Mut<'_, T>, root: usize) -> Result<()>
    where
        Self: Sized,
    {
        M::broadcast(self, buf, root)
    }

    /// Reduces every rank's `send` (length `sum(counts)`, same on all ranks)
    /// and leaves block `rank` (offset `sum(counts[..rank])`, length
    /// `counts[rank]`) in `recv`, scaled as in `allreduce`.
    fn reduce_scatter<T: Element>(
        &mut self,
        send: M::Ref<'_, T>,
        recv: M::Mut<'_, T>,
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()>
    where
        Self: Sized,
    {
        M::reduce_scatter(self, send, recv, counts, op, scale)
    }

    /// `send` holds `send_counts[p]` elements for each peer p, peer after
    /// peer; `recv` receives `recv_counts[p]` from each peer p, in peer order.
    fn alltoallv<T: Element>(
        &mut self,
        send: M::Ref<'_, T>,
        send_counts: &[usize],
        recv: M::Mut<'_, T>,
        recv_counts: &[usize],
    ) -> Result<()>
    where
        Self: Sized,
    {
        M::alltoallv(self, send, send_counts, recv, recv_counts)
    }

    /// Returns once every rank has entered.
    fn barrier(&mut self) -> Result<()>
    where
        Self: Sized,
    {
        M::barrier(self)
    }

    /// Runs every operation of `tx` as one group: collectives run in the
    /// order scheduled; sends and receives may be matched in any order
    /// without deadlock on backends that issue the group natively (NCCL,
    /// MPI's non-blocking calls) or buffer their sends (kolo-threads). The
    /// host default, [`Transaction::run_default`], guarantees that only for
    /// exchanges of paired sends and receives; see its documentation.
    fn execute<T: Element>(&mut self, tx: Transaction<'_, T, M>) -> Result<()>
    where
        Self: Sized,
    {
        M::execute(self, tx)
    }

    /// Waits until every operation this rank called has completed; the
    /// first asynchronous failure among them is returned. Host backends
    /// complete each operation before returning from it: the default
    /// returns at once.
    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }

    /// A new buffer of `len` elements of `M` (contents: zero bits, or
    /// `T::default()` on the host), ordered like the operations.
    fn new_buffer<T: Element>(&mut self, len: usize) -> Result<M::Owned<T>>
    where
        Self: Sized,
    {
        M::new_buffer(self, len)
    }

    /// A new buffer of `M` holding `data`.
    fn buffer_from<T: Element>(&mut self, data: &[T]) -> Result<M::Owned<T>>
    where
        Self: Sized,
    {
        M::buffer_from(self, data)
    }

    /// The elements of `buf`, on the host, once every operation called
    /// before has written them.
    fn read_buffer<T: Element>(&mut self, buf: M::Ref<'_, T>) -> Result<Vec<T>>
    where
        Self: Sized,
    {
        M::read_buffer(self, buf)
    }

    /// Copies `srcs` one after another into `dst`, which holds exactly
    /// their total length: a fused buffer's copy in (kolo-fusion).
    fn pack_into<T: Element>(&mut self, srcs: &[M::Ref<'_, T>], dst: M::Mut<'_, T>) -> Result<()>
    where
        Self: Sized,
    {
        M::pack_into(self, srcs, dst)
    }

    /// Copies consecutive pieces of `src`, which holds exactly their total
    /// length, into `dsts`: a fused buffer's copy out.
    fn unpack_from<T: Element>(
        &mut self,
        src: M::Ref<'_, T>,
        dsts: &mut [M::Mut<'_, T>],
    ) -> Result<()>
    where
        Self: Sized,
    {
        M::unpack_from(self, src, dsts)
    }
}

/// A complete backend: control plane and host data plane.
pub trait Backend: Controller + Collectives {}
impl<B: Controller + Collectives> Backend for B {}
