//! [`UntrackedSpace`]: the memory of one device as one untracked source,
//! viewed from raw addresses (what kolo's engine lends by address).

use crate::safe::views::{CudaMut, CudaRef, ReadSource, WriteSource};
use crate::span::Span;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;
use kolo_transport::Element;
use std::sync::Arc;

/// The memory of one device as a single untracked source: views of it are
/// made from raw addresses ([`UntrackedSpace::view_mut`]) and cost no
/// allocation, no driver call and no cudarc event each. For callers that
/// lend many buffers by address and order their streams themselves, once
/// for all of them (kolo's engine: one ready event per submission of a
/// thousand gradients). An operation on several views of one space orders
/// and records the space once, as one buffer.
#[derive(Debug)]
pub struct UntrackedSpace {
    stream: Arc<CudaStream>,
}

impl UntrackedSpace {
    /// The memory of `stream`'s device (the stream only names the device:
    /// nothing is ordered on it).
    pub fn new(stream: Arc<CudaStream>) -> Self {
        UntrackedSpace { stream }
    }

    /// The span of `len` elements of `T` at `ptr`, in elements from
    /// address 0; `None` when `ptr` is not aligned to `T` (no cudarc
    /// buffer of `T` is).
    fn span<T>(ptr: CUdeviceptr, len: usize) -> Option<Span> {
        let elem = std::mem::size_of::<T>().max(1) as u64;
        if ptr % elem != 0 {
            return None;
        }
        Some(Span {
            offset: usize::try_from(ptr / elem).ok()?,
            len,
        })
    }

    /// A writable view of `len` elements of `T` at `ptr`; `None` when
    /// `ptr` is not aligned to `T`.
    ///
    /// # Safety
    /// As [`Untracked::from_raw`], on this space's device: the memory
    /// stays allocated until every operation given the view has run, the
    /// caller orders those operations after the memory's earlier uses and
    /// before its later ones, and while the view lives no other view
    /// overlapping it is used (kolo-nccl cannot tell views of one space
    /// apart).
    pub unsafe fn view_mut<T: Element>(
        &self,
        ptr: CUdeviceptr,
        len: usize,
    ) -> Option<CudaMut<'_, T>> {
        Some(CudaMut::borrowing(self, Self::span::<T>(ptr, len)?))
    }

    /// A read-only view of `len` elements of `T` at `ptr`; `None` when
    /// `ptr` is not aligned to `T`.
    ///
    /// # Safety
    /// As [`UntrackedSpace::view_mut`], except that other read-only views
    /// may overlap it.
    pub unsafe fn view<T: Element>(&self, ptr: CUdeviceptr, len: usize) -> Option<CudaRef<'_, T>> {
        Some(CudaRef::borrowing(self, Self::span::<T>(ptr, len)?))
    }
}

/// Address 0 is the space's base: a view's span is its address.
impl ReadSource for UntrackedSpace {
    fn home(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    fn before_read(&self, _stream: &CudaStream) -> CUdeviceptr {
        0
    }
    fn after_read(&self, _stream: &CudaStream) {}
}

impl WriteSource for UntrackedSpace {
    fn before_write(&self, _stream: &CudaStream) -> CUdeviceptr {
        0
    }
    fn after_write(&self, _stream: &CudaStream) {}
    fn as_read(&self) -> &dyn ReadSource {
        self
    }
}
