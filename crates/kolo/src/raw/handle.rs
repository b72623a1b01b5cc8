//! [`RawHandle`]: an operation on [`RawTensor`](super::RawTensor)s in
//! flight, owned by nobody's scope: it lives as long as its owner keeps
//! it (a C handle number, a Python object) and can hand its completion to
//! a callback. [`RawOutput`]: what an allgather or an alltoall delivered,
//! in memory kolo owns until the output is dropped.

use crate::error::Error;
use crate::handle::Handle;
use kolo_protocol::DataType;
use std::any::Any;
use std::ffi::c_void;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Something kept alive until the operation completed (the device
/// wrappers of the caller's memory, a binding's references to the
/// tensors).
pub(crate) type Keep = Box<dyn Any + Send>;

/// An operation on raw tensors in flight (see [`crate::raw`]).
///
/// Dropping the handle does not cancel the operation (no collective can
/// be cancelled on one rank alone): it completes on every rank, and the
/// caller's memory must stay valid until it has — which only the handle
/// tells, so keep it until [`RawHandle::wait`], [`RawHandle::poll`] or
/// the callback of [`RawHandle::on_complete`] reported the result.
#[must_use = "a raw operation's memory must stay valid until its handle reports completion"]
pub struct RawHandle {
    pub(crate) handle: Handle<'static, Option<RawOutput>>,
    /// Released once the operation completed.
    pub(crate) keep: Vec<Keep>,
}

impl RawHandle {
    /// The names of the tensors the handle waits for.
    pub fn tensors(&self) -> impl Iterator<Item = &str> {
        self.handle.tensors()
    }

    /// True once the operation completed.
    pub fn is_complete(&self) -> bool {
        self.handle.is_complete()
    }

    /// The result once the operation completed (`None` before): the
    /// output of an allgather or an alltoall, `None` inside `Ok` for the
    /// operations that write the caller's memory in place. A further call
    /// returns an error.
    pub fn poll(&mut self) -> Option<Result<Option<RawOutput>, Error>> {
        let result = self.handle.poll()?;
        self.keep.clear();
        Some(result)
    }

    /// Blocks until the operation completed; its result as in
    /// [`RawHandle::poll`].
    pub fn wait(mut self) -> Result<Option<RawOutput>, Error> {
        let result = std::mem::replace(&mut self.handle, Handle::spent()).wait();
        self.keep.clear();
        result
    }

    /// [`RawHandle::wait`] for at most `timeout`: `None` if the operation
    /// is still in flight then (wait again, or poll).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<Option<RawOutput>, Error>> {
        let result = self.handle.wait_timeout(timeout)?;
        self.keep.clear();
        Some(result)
    }

    /// Calls `callback` with the result once the operation completed, on
    /// kolo's callback thread (one per process, never the engine's, so a
    /// callback may block or submit without stalling the engine; callbacks
    /// run one at a time, in the order their operations completed).
    pub fn on_complete(
        self,
        callback: impl FnOnce(Result<Option<RawOutput>, Error>) + Send + 'static,
    ) {
        super::callbacks::when_done(self, Box::new(callback));
    }

    /// Polls as a future does: registers `waker` while in flight.
    pub(crate) fn poll_with(&mut self, waker: &Waker) -> Poll<Result<Option<RawOutput>, Error>> {
        let mut context = Context::from_waker(waker);
        match std::future::Future::poll(std::pin::Pin::new(&mut self.handle), &mut context) {
            Poll::Ready(result) => {
                self.keep.clear();
                Poll::Ready(result)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl std::future::Future for RawHandle {
    type Output = Result<Option<RawOutput>, Error>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().poll_with(cx.waker())
    }
}

impl Drop for RawHandle {
    /// Whatever must outlive the operation (the keep list) waits for it
    /// on the callback thread, without blocking the dropper.
    fn drop(&mut self) {
        if self.keep.is_empty() || self.handle.is_complete() {
            return;
        }
        let keep = std::mem::take(&mut self.keep);
        let handle = RawHandle {
            handle: std::mem::replace(&mut self.handle, Handle::spent()),
            keep,
        };
        handle.on_complete(|_| {});
    }
}

impl std::fmt::Debug for RawHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.handle.fmt(f)
    }
}

/// What an allgather or an alltoall delivered to this rank, in memory
/// kolo owns (host memory, or the engine's GPU) until it is dropped.
pub struct RawOutput {
    /// The owner of the memory (a `Vec<T>`, a `CudaSlice<T>`).
    pub(crate) owner: Box<dyn Any + Send>,
    pub(crate) data: *const c_void,
    pub(crate) dtype: DataType,
    pub(crate) shape: Vec<usize>,
    pub(crate) splits: Vec<usize>,
    pub(crate) device: Option<usize>,
}

// SAFETY: the owner is `Send` and `data` points into it; nothing reads
// through `data` but the caller of `data()`, under its own `unsafe`.
unsafe impl Send for RawOutput {}

impl RawOutput {
    /// The address of the first element (host memory, or the GPU's).
    pub fn data(&self) -> *const c_void {
        self.data
    }

    /// The data type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The dimensions: every rank's rows in rank order for an allgather,
    /// what arrived for an alltoall.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// How many rows came from each rank (an alltoall; empty otherwise).
    pub fn splits(&self) -> &[usize] {
        &self.splits
    }

    /// The number of elements.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The size in bytes.
    pub fn byte_len(&self) -> usize {
        self.elements() * self.dtype.size()
    }

    /// The CUDA device holding the data, `None` for host memory.
    pub fn device(&self) -> Option<usize> {
        self.device
    }

    /// The elements as a `Vec<T>` (host memory of `T`s), without a copy;
    /// `Err(self)` for another type or device memory.
    pub fn into_vec<T: 'static>(self) -> Result<Vec<T>, RawOutput> {
        let RawOutput {
            owner,
            data,
            dtype,
            shape,
            splits,
            device,
        } = self;
        // The elements stay where they are: a `Vec` moved keeps its buffer.
        owner
            .downcast::<Vec<T>>()
            .map(|v| *v)
            .map_err(|owner| RawOutput {
                owner,
                data,
                dtype,
                shape,
                splits,
                device,
            })
    }

    /// A host output of `data` with `shape` (and `splits` for an alltoall).
    pub(crate) fn host<T: kolo_transport::Element>(
        data: Vec<T>,
        shape: Vec<usize>,
        splits: Vec<usize>,
    ) -> RawOutput {
        RawOutput {
            data: data.as_ptr().cast(),
            owner: Box::new(data),
            dtype: T::DTYPE,
            shape,
            splits,
            device: None,
        }
    }
}

impl std::fmt::Debug for RawOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawOutput")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("splits", &self.splits)
            .field("device", &self.device)
            .finish()
    }
}
