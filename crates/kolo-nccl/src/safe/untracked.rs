//! [`Untracked`]: device memory handed to kolo-nccl by address, without
//! cudarc's per-buffer events. Every operation accepts it like a
//! `CudaSlice` or a view (it implements cudarc's `DevicePtr` /
//! `DevicePtrMut`), but using it costs no driver call: no stream wait for
//! the buffer's last use, no event record after this one.
//!
//! For callers that order the streams themselves, once for many buffers:
//! a caller that fuses a thousand gradients records one ready event on
//! their stream and makes the communication stream wait for it once,
//! instead of cudarc's two or three driver calls per gradient and use.

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};
use std::marker::PhantomData;
use std::sync::Arc;

/// `len` elements of `T` at a device address, on the device of `stream`.
#[derive(Debug)]
pub struct Untracked<T> {
    ptr: CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _elem: PhantomData<T>,
}

impl<T> Untracked<T> {
    /// The memory at `ptr`.
    ///
    /// # Safety
    /// `ptr` addresses `len` elements of `T` on `stream`'s device. The
    /// memory stays allocated until every operation given this value has
    /// run on the GPU, and the caller orders those operations after the
    /// memory's earlier writes (and, for an output, reads) and before its
    /// later uses — kolo-nccl adds no ordering of its own for it.
    pub unsafe fn from_raw(ptr: CUdeviceptr, len: usize, stream: Arc<CudaStream>) -> Self {
        Untracked {
            ptr,
            len,
            stream,
            _elem: PhantomData,
        }
    }

    /// `view`'s memory, to be read by work ordered after what is enqueued
    /// on `stream` now: `stream` waits (on the GPU) for the view's last
    /// write, as cudarc tracks it (no driver call when it tracks none).
    ///
    /// # Safety
    /// As [`Untracked::from_raw`]: the memory outlives the work given this
    /// value, that work runs after what `stream` holds now, and nothing
    /// writes the memory until it has run.
    pub unsafe fn read_after(view: &CudaView<'_, T>, stream: &Arc<CudaStream>) -> Self {
        let (ptr, guard) = view.device_ptr(stream);
        // The guard would record the view's read event on `stream` now,
        // before the work that actually reads it; the caller orders that
        // work instead.
        std::mem::forget(guard);
        // SAFETY: per the caller's contract; `ptr` spans the view.
        unsafe { Untracked::from_raw(ptr, view.len(), Arc::clone(stream)) }
    }

    /// `view`'s memory, to be written by work ordered after what is
    /// enqueued on `stream` now: `stream` waits (on the GPU) for the
    /// view's last read and write, as cudarc tracks them.
    ///
    /// # Safety
    /// As [`Untracked::read_after`], and nothing else reads the memory
    /// until the work has run.
    pub unsafe fn write_after(view: &mut CudaViewMut<'_, T>, stream: &Arc<CudaStream>) -> Self {
        let len = view.len();
        let (ptr, guard) = view.device_ptr_mut(stream);
        // As in `read_after`.
        std::mem::forget(guard);
        // SAFETY: per the caller's contract; `ptr` spans the view.
        unsafe { Untracked::from_raw(ptr, len, Arc::clone(stream)) }
    }

    /// The first `len` elements (at most all of them).
    pub fn prefix(&self, len: usize) -> Untracked<T> {
        Untracked {
            ptr: self.ptr,
            len: len.min(self.len),
            stream: Arc::clone(&self.stream),
            _elem: PhantomData,
        }
    }
}

impl<T> DeviceSlice<T> for Untracked<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for Untracked<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for Untracked<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}
