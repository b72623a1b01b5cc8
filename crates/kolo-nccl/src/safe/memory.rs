//! [`Cuda`]: CUDA device memory as a kolo [`Memory`], so that code written
//! once over memories (kolo-fusion, kolo-conformance) runs on
//! [`NcclComm`](crate::NcclComm)'s device data plane: views are
//! [`CudaRef`] / [`CudaMut`], allocations [`CudaBuffer`].
//!
//! NCCL serves every collective natively, so the [`Memory`] hooks (what a
//! backend gets without implementing it) all fail as
//! [`TransportError::Unsupported`]: a backend of CUDA memory implements
//! every method of `Collectives<Cuda>`, as `NcclComm` does.

use crate::safe::views::{CudaMut, CudaRef};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use kolo_protocol::ReduceOp;
use kolo_transport::memory::native_only;
use kolo_transport::{Collectives, Element, Memory, MemoryKind, Result, Scale, Transaction};
use std::sync::Arc;

/// CUDA device memory (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cuda;

/// A device allocation of `len` elements of `T`: [`Cuda`]'s `Owned`,
/// made by `Collectives::<Cuda>::new_buffer` / `buffer_from` or from a
/// cudarc slice. An empty buffer holds one spare element (CUDA has no
/// empty allocations); its views and length say 0.
#[derive(Debug)]
pub struct CudaBuffer<T> {
    slice: CudaSlice<T>,
    len: usize,
}

impl<T: Element> CudaBuffer<T> {
    /// `slice` as a buffer of all its elements.
    pub fn from_slice(slice: CudaSlice<T>) -> Self {
        let len = slice.len();
        CudaBuffer { slice, len }
    }

    /// The first `len` elements of `slice` (at most all of them).
    pub(crate) fn with_len(slice: CudaSlice<T>, len: usize) -> Self {
        let len = len.min(slice.len());
        CudaBuffer { slice, len }
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A read-only view of every element.
    pub fn view(&self) -> CudaRef<'_, T> {
        CudaRef::prefix(&self.slice, self.len)
    }

    /// A writable view of every element.
    pub fn view_mut(&mut self) -> CudaMut<'_, T> {
        CudaMut::prefix(&mut self.slice, self.len)
    }

    /// The elements as a cudarc view, for cudarc's own operations.
    pub fn cuda_view(&self) -> CudaView<'_, T> {
        self.slice.slice(..self.len)
    }

    /// The elements as a writable cudarc view.
    pub fn cuda_view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.slice_mut(..self.len)
    }

    /// The stream the buffer was allocated on (and is freed on).
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.slice.stream()
    }
}

impl Memory for Cuda {
    const KIND: MemoryKind = MemoryKind::Cuda;

    type Ref<'a, T: Element> = CudaRef<'a, T>;
    type Mut<'a, T: Element> = CudaMut<'a, T>;
    type Owned<T: Element> = CudaBuffer<T>;

    fn len<T: Element>(buf: CudaRef<'_, T>) -> usize {
        buf.len()
    }
    fn len_mut<T: Element>(buf: &CudaMut<'_, T>) -> usize {
        buf.len()
    }
    fn freeze<'b, T: Element>(buf: &'b CudaMut<'_, T>) -> CudaRef<'b, T> {
        buf.freeze()
    }
    fn reborrow<'b, T: Element>(buf: &'b mut CudaMut<'_, T>) -> CudaMut<'b, T> {
        buf.reborrow()
    }
    // Named through `Self::Ref` / `Self::Mut` as the trait does (see
    // kolo-transport's `Host`): the lifetimes are early-bound there.
    fn split_at<'a, T: Element>(
        buf: Self::Ref<'a, T>,
        at: usize,
    ) -> (Self::Ref<'a, T>, Self::Ref<'a, T>) {
        buf.split_at(at)
    }
    fn split_at_mut<'a, T: Element>(
        buf: Self::Mut<'a, T>,
        at: usize,
    ) -> (Self::Mut<'a, T>, Self::Mut<'a, T>) {
        buf.split_at_mut(at)
    }
    fn view<T: Element>(buf: &CudaBuffer<T>) -> CudaRef<'_, T> {
        buf.view()
    }
    fn view_mut<T: Element>(buf: &mut CudaBuffer<T>) -> CudaMut<'_, T> {
        buf.view_mut()
    }
    fn owned_len<T: Element>(buf: &CudaBuffer<T>) -> usize {
        buf.len()
    }

    fn allreduce<C: Collectives<Cuda>, T: Element>(
        _: &mut C,
        _: CudaMut<'_, T>,
        _: ReduceOp,
        _: Scale,
    ) -> Result<()> {
        Err(native_only("allreduce", MemoryKind::Cuda))
    }
    fn allgatherv<C: Collectives<Cuda>, T: Element>(
        _: &mut C,
        _: CudaRef<'_, T>,
        _: CudaMut<'_, T>,
        _: &[usize],
    ) -> Result<()> {
        Err(native_only("allgatherv", MemoryKind::Cuda))
    }
    fn broadcast<C: Collectives<Cuda>, T: Element>(
        _: &mut C,
        _: CudaMut<'_, T>,
        _: usize,
    ) -> Result<()> {
        Err(native_only("broadcast", MemoryKind::Cuda))
    }
    fn reduce_scatter<C: Collectives<Cuda>, T: Element>(
        _: &mut C,
        _: CudaRef<'_, T>,
        _: CudaMut<'_, T>,
        _: &[usize],
        _: ReduceOp,
        _: Scale,
    ) -> Result<()> {
        Err(native_only("reduce_scatter", MemoryKind::Cuda))
    }
    fn alltoallv<C: Collectives<Cuda>, T: Element>(
        _: &mut C,
        _: CudaRef<'_, T>,
        _: &[usize],
        _: CudaMut<'_, T>,
        _: &[usize],
    ) -> Result<()> {
        Err(native_only("alltoallv", MemoryKind::Cuda))
    }
    fn barrier<C: Collectives<Cuda>>(_: &mut C) -> Result<()> {
        Err(native_only("barrier", MemoryKind::Cuda))
    }
    fn execute<C: Collectives<Cuda>, T: Element>(
        _: &mut C,
        _: Transaction<'_, T, Cuda>,
    ) -> Result<()> {
        Err(native_only("a transaction", MemoryKind::Cuda))
    }
    fn new_buffer<C: Collectives<Cuda>, T: Element>(_: &mut C, _: usize) -> Result<CudaBuffer<T>> {
        Err(native_only("allocating a buffer", MemoryKind::Cuda))
    }
    fn buffer_from<C: Collectives<Cuda>, T: Element>(_: &mut C, _: &[T]) -> Result<CudaBuffer<T>> {
        Err(native_only("uploading a buffer", MemoryKind::Cuda))
    }
    fn read_buffer<C: Collectives<Cuda>, T: Element>(
        _: &mut C,
        _: CudaRef<'_, T>,
    ) -> Result<Vec<T>> {
        Err(native_only("downloading a buffer", MemoryKind::Cuda))
    }
    fn pack_into<C: Collectives<Cuda>, T: Element>(
        _: &mut C,
        _: &[CudaRef<'_, T>],
        _: CudaMut<'_, T>,
    ) -> Result<()> {
        Err(native_only("pack", MemoryKind::Cuda))
    }
    fn unpack_from<C: Collectives<Cuda>, T: Element>(
        _: &mut C,
        _: CudaRef<'_, T>,
        _: &mut [CudaMut<'_, T>],
    ) -> Result<()> {
        Err(native_only("unpack", MemoryKind::Cuda))
    }
}
