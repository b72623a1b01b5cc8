//! The memory a data plane works on: host memory ([`Host`], slices) or a
//! device's (a backend's own [`Memory`], such as kolo-nccl's CUDA memory).
//!
//! [`Collectives`] is generic over it, so that one trait, one fusion
//! (kolo-fusion) and one conformance suite serve host and device buffers
//! alike. A memory names its views (read-only, writable, owned) and the
//! few operations on them that code generic over memories needs: lengths,
//! splitting, reborrowing. It also carries what a backend of that memory
//! gets without implementing it: for host memory the generic algorithms
//! over `send` and `recv` ([`crate::algorithms`]) and plain copies; a
//! device memory's backend implements its collectives natively, and the
//! defaults it does not override fail with
//! [`TransportError::Unsupported`](crate::TransportError::Unsupported).

use crate::element::Element;
use crate::error::{Result, TransportError};
use crate::traits::{Collectives, MemoryKind, Scale};
use crate::transaction::Transaction;
use kolo_protocol::ReduceOp;

/// A kind of memory and its views. Views are cheap handles: `Ref` is a
/// shared view (`&[T]` on the host), `Mut` a unique one (`&mut [T]`),
/// `Owned` an allocation (`Vec<T>`).
pub trait Memory: Sized + Send + Sync + 'static {
    /// Which memory this is.
    const KIND: MemoryKind;

    /// A read-only view of `T`s.
    type Ref<'a, T: Element>: Copy + std::fmt::Debug;
    /// A writable view of `T`s.
    type Mut<'a, T: Element>: std::fmt::Debug;
    /// An allocation of `T`s.
    type Owned<T: Element>: Send + 'static;

    /// The elements of a view.
    fn len<T: Element>(buf: Self::Ref<'_, T>) -> usize;
    /// The elements of a writable view.
    fn len_mut<T: Element>(buf: &Self::Mut<'_, T>) -> usize;
    /// A read-only view of a writable one, for as long as it is borrowed.
    fn freeze<'b, T: Element>(buf: &'b Self::Mut<'_, T>) -> Self::Ref<'b, T>;
    /// A writable view of a writable one, for as long as it is borrowed.
    fn reborrow<'b, T: Element>(buf: &'b mut Self::Mut<'_, T>) -> Self::Mut<'b, T>;
    /// The first `at` elements and the rest (`at` at most the length).
    fn split_at<'a, T: Element>(
        buf: Self::Ref<'a, T>,
        at: usize,
    ) -> (Self::Ref<'a, T>, Self::Ref<'a, T>);
    /// The first `at` elements and the rest, writable.
    fn split_at_mut<'a, T: Element>(
        buf: Self::Mut<'a, T>,
        at: usize,
    ) -> (Self::Mut<'a, T>, Self::Mut<'a, T>);
    /// A view of an allocation.
    fn view<T: Element>(buf: &Self::Owned<T>) -> Self::Ref<'_, T>;
    /// A writable view of an allocation.
    fn view_mut<T: Element>(buf: &mut Self::Owned<T>) -> Self::Mut<'_, T>;
    /// The length of an allocation.
    fn owned_len<T: Element>(buf: &Self::Owned<T>) -> usize {
        Self::len(Self::view(buf))
    }

    /// What [`Collectives::allreduce`] does unless the backend overrides it.
    fn allreduce<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        buf: Self::Mut<'_, T>,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()>;
    /// What [`Collectives::allgatherv`] does unless overridden.
    fn allgatherv<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        send: Self::Ref<'_, T>,
        recv: Self::Mut<'_, T>,
        counts: &[usize],
    ) -> Result<()>;
    /// What [`Collectives::broadcast`] does unless overridden.
    fn broadcast<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        buf: Self::Mut<'_, T>,
        root: usize,
    ) -> Result<()>;
    /// What [`Collectives::reduce_scatter`] does unless overridden.
    fn reduce_scatter<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        send: Self::Ref<'_, T>,
        recv: Self::Mut<'_, T>,
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()>;
    /// What [`Collectives::alltoallv`] does unless overridden.
    fn alltoallv<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        send: Self::Ref<'_, T>,
        send_counts: &[usize],
        recv: Self::Mut<'_, T>,
        recv_counts: &[usize],
    ) -> Result<()>;
    /// What [`Collectives::barrier`] does unless overridden.
    fn barrier<C: Collectives<Self>>(comm: &mut C) -> Result<()>;
    /// What [`Collectives::execute`] does unless overridden.
    fn execute<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        tx: Transaction<'_, T, Self>,
    ) -> Result<()>;
    /// What [`Collectives::new_buffer`] does unless overridden.
    fn new_buffer<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        len: usize,
    ) -> Result<Self::Owned<T>>;
    /// What [`Collectives::buffer_from`] does unless overridden.
    fn buffer_from<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        data: &[T],
    ) -> Result<Self::Owned<T>>;
    /// What [`Collectives::read_buffer`] does unless overridden.
    fn read_buffer<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        buf: Self::Ref<'_, T>,
    ) -> Result<Vec<T>>;
    /// What [`Collectives::pack_into`] does unless overridden.
    fn pack_into<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        srcs: &[Self::Ref<'_, T>],
        dst: Self::Mut<'_, T>,
    ) -> Result<()>;
    /// What [`Collectives::unpack_from`] does unless overridden.
    fn unpack_from<C: Collectives<Self>, T: Element>(
        comm: &mut C,
        src: Self::Ref<'_, T>,
        dsts: &mut [Self::Mut<'_, T>],
    ) -> Result<()>;
}

/// Host (CPU) memory: views are slices, allocations `Vec`s, and every
/// collective defaults to the generic algorithms over `send` and `recv`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Host;

impl Memory for Host {
    const KIND: MemoryKind = MemoryKind::Host;

    type Ref<'a, T: Element> = &'a [T];
    type Mut<'a, T: Element> = &'a mut [T];
    type Owned<T: Element> = Vec<T>;

    fn len<T: Element>(buf: &[T]) -> usize {
        buf.len()
    }
    fn len_mut<T: Element>(buf: &&mut [T]) -> usize {
        buf.len()
    }
    fn freeze<'b, T: Element>(buf: &'b &mut [T]) -> &'b [T] {
        buf
    }
    fn reborrow<'b, T: Element>(buf: &'b mut &mut [T]) -> &'b mut [T] {
        buf
    }
    // The lifetimes of the views are named through `Self::Ref` and
    // `Self::Mut`, as the trait does: they appear only in projections
    // there, which makes them early-bound, and the impl must agree.
    fn split_at<'a, T: Element>(
        buf: Self::Ref<'a, T>,
        at: usize,
    ) -> (Self::Ref<'a, T>, Self::Ref<'a, T>) {
        buf.split_at(at.min(buf.len()))
    }
    fn split_at_mut<'a, T: Element>(
        buf: Self::Mut<'a, T>,
        at: usize,
    ) -> (Self::Mut<'a, T>, Self::Mut<'a, T>) {
        let at = at.min(buf.len());
        buf.split_at_mut(at)
    }
    fn view<T: Element>(buf: &Vec<T>) -> &[T] {
        buf
    }
    fn view_mut<T: Element>(buf: &mut Vec<T>) -> &mut [T] {
        buf
    }

    fn allreduce<C: Collectives<Host>, T: Element>(
        comm: &mut C,
        buf: &mut [T],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        crate::algorithms::allreduce(comm, buf, op, scale)
    }
    fn allgatherv<C: Collectives<Host>, T: Element>(
        comm: &mut C,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        crate::algorithms::ring_allgatherv(comm, send, recv, counts)
    }
    fn broadcast<C: Collectives<Host>, T: Element>(
        comm: &mut C,
        buf: &mut [T],
        root: usize,
    ) -> Result<()> {
        crate::algorithms::tree_broadcast(comm, buf, root)
    }
    fn reduce_scatter<C: Collectives<Host>, T: Element>(
        comm: &mut C,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        crate::algorithms::ring_reduce_scatter(comm, send, recv, counts, op, scale)
    }
    fn alltoallv<C: Collectives<Host>, T: Element>(
        comm: &mut C,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        crate::algorithms::pairwise_alltoallv(comm, send, send_counts, recv, recv_counts)
    }
    fn barrier<C: Collectives<Host>>(comm: &mut C) -> Result<()> {
        crate::algorithms::dissemination_barrier(comm)
    }
    fn execute<C: Collectives<Host>, T: Element>(
        comm: &mut C,
        tx: Transaction<'_, T, Host>,
    ) -> Result<()> {
        tx.run_default(comm)
    }
    fn new_buffer<C: Collectives<Host>, T: Element>(_: &mut C, len: usize) -> Result<Vec<T>> {
        Ok(vec![T::default(); len])
    }
    fn buffer_from<C: Collectives<Host>, T: Element>(_: &mut C, data: &[T]) -> Result<Vec<T>> {
        Ok(data.to_vec())
    }
    fn read_buffer<C: Collectives<Host>, T: Element>(_: &mut C, buf: &[T]) -> Result<Vec<T>> {
        Ok(buf.to_vec())
    }
    fn pack_into<C: Collectives<Host>, T: Element>(
        _: &mut C,
        srcs: &[&[T]],
        dst: &mut [T],
    ) -> Result<()> {
        crate::copies::pack(dst, srcs)
    }
    fn unpack_from<C: Collectives<Host>, T: Element>(
        _: &mut C,
        src: &[T],
        dsts: &mut [&mut [T]],
    ) -> Result<()> {
        crate::copies::unpack(src, dsts)
    }
}

/// The error of a default that a backend of a memory other than the host's
/// must implement itself (see the module docs).
pub fn native_only(what: &str, memory: MemoryKind) -> TransportError {
    TransportError::Unsupported(format!(
        "{what} on {memory:?} memory has no generic algorithm: the backend must implement it"
    ))
}
