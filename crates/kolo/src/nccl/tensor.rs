//! Device tensors as the caller hands them in ([`DeviceTensor`],
//! [`DeviceTensorMut`]: a cudarc view plus a shape) and as the engine
//! receives them (`DeviceArgs`: lifetime-erased views and their
//! addresses, the ready events, and a `Lease` that tells the caller's
//! scope when the engine is done with the memory).

use super::ready::ReadyEvent;
use crate::engine::lease::Lease;
use crate::placed::sealed::Sealed;
use crate::placed::{IntoTensor, IntoTensorMut, Placed, PlacedMut};
use crate::tensor::Dims;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use kolo_nccl::Untracked;
use kolo_transport::Element;
use std::any::Any;
use std::sync::Arc;

/// A read-only device tensor: a cudarc view and a row-major shape. A
/// `&CudaSlice` or a `CudaView` converts into a 1-D tensor.
#[derive(Debug)]
pub struct DeviceTensor<'a, T> {
    pub(crate) view: CudaView<'a, T>,
    pub(crate) shape: Dims,
}

/// A writable device tensor: a cudarc view and a row-major shape. A
/// `&mut CudaSlice` or a `CudaViewMut` converts into a 1-D tensor.
#[derive(Debug)]
pub struct DeviceTensorMut<'a, T> {
    pub(crate) view: CudaViewMut<'a, T>,
    pub(crate) shape: Dims,
}

impl<'a, T> DeviceTensor<'a, T> {
    /// `view` with `shape` (checked against its length at submission).
    pub fn with_shape(view: CudaView<'a, T>, shape: impl AsRef<[usize]>) -> Self {
        DeviceTensor {
            view,
            shape: Dims::from_slice(shape.as_ref()),
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
}

impl<'a, T> DeviceTensorMut<'a, T> {
    /// `view` with `shape` (checked against its length at submission).
    pub fn with_shape(view: CudaViewMut<'a, T>, shape: impl AsRef<[usize]>) -> Self {
        DeviceTensorMut {
            view,
            shape: Dims::from_slice(shape.as_ref()),
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
}

impl<'a, T> From<&'a CudaSlice<T>> for DeviceTensor<'a, T> {
    fn from(slice: &'a CudaSlice<T>) -> Self {
        let shape = Dims::from_buf_and_len([slice.len(), 0, 0, 0], 1);
        DeviceTensor {
            view: slice.as_view(),
            shape,
        }
    }
}

impl<'a, T> From<CudaView<'a, T>> for DeviceTensor<'a, T> {
    fn from(view: CudaView<'a, T>) -> Self {
        let shape = Dims::from_buf_and_len([view.len(), 0, 0, 0], 1);
        DeviceTensor { view, shape }
    }
}

impl<'a, T> From<&'a mut CudaSlice<T>> for DeviceTensorMut<'a, T> {
    fn from(slice: &'a mut CudaSlice<T>) -> Self {
        let shape = Dims::from_buf_and_len([slice.len(), 0, 0, 0], 1);
        DeviceTensorMut {
            view: slice.as_view_mut(),
            shape,
        }
    }
}

impl<'a, T> From<CudaViewMut<'a, T>> for DeviceTensorMut<'a, T> {
    fn from(view: CudaViewMut<'a, T>) -> Self {
        let shape = Dims::from_buf_and_len([view.len(), 0, 0, 0], 1);
        DeviceTensorMut { view, shape }
    }
}

/// What a device alltoall delivered to this rank.
#[derive(Debug)]
pub struct DeviceReceived<T> {
    /// Every peer's rows for this rank, in peer order, in a buffer the
    /// engine allocated on its stream (one spare element when nothing
    /// arrived: CUDA allocates no empty buffers).
    pub data: CudaSlice<T>,
    /// How many rows came from each peer, in peer order.
    pub splits: Vec<usize>,
}

/// The caller's memory the engine works on for one tensor, with the
/// borrow's lifetime erased: the [`Lease`] keeps the caller's scope
/// waiting until this value is dropped (see `Scope`).
///
/// The engine works on the addresses (`read`, `write`): no cudarc event
/// per tensor and use. The views stay for the failure path, where the
/// engine records their events after whatever it enqueued (`fence`).
pub(crate) struct DeviceArgs<T: 'static> {
    /// The input of an out-of-place operation (allgather, reduce-scatter).
    pub input: Option<CudaView<'static, T>>,
    /// The buffer written: in place (allreduce, broadcast) or the output
    /// (reduce-scatter).
    pub output: Option<CudaViewMut<'static, T>>,
    /// `input`'s memory, ordered after its last write by the ready event.
    pub read: Option<Untracked<T>>,
    /// `output`'s memory, ordered after its last uses by the ready event.
    pub write: Option<Untracked<T>>,
    /// Recorded on the streams of the tensor's buffers at submission,
    /// after the waits for the buffers' cudarc events; the engine's stream
    /// waits for them on the GPU before touching the memory.
    pub ready: Vec<Arc<ReadyEvent>>,
    /// Released (dropped) when the engine no longer refers to the memory.
    pub _lease: Lease,
}

impl<T> DeviceArgs<T> {
    /// Records the views' cudarc events on `stream` after everything
    /// enqueued there: once the engine gives the memory back after a
    /// failure (work that may still run), a later use or free of the
    /// caller's buffers waits for it on the GPU.
    pub(crate) fn fence(&mut self, stream: &CudaStream) {
        if let Some(view) = &self.input {
            // The guard records the view's read event when it drops.
            let (_ptr, _read) = view.device_ptr(stream);
        }
        if let Some(view) = &mut self.output {
            let (_ptr, _written) = view.device_ptr_mut(stream);
        }
    }
}

/// What the engine hands back for one device tensor: an output it
/// allocated (allgather's `CudaSlice<T>`), if any. The handle completes
/// once the GPU work has completed, so the caller's streams need no event
/// to wait for.
pub(crate) struct DeviceDone {
    pub output: Option<Box<dyn Any + Send>>,
}

/// The memory and element type of device tensors lent to the engine by
/// address (`Inputs::Device`'s element: not an `Element` type, so the
/// host side never views them).
pub(crate) struct OnDevice<T>(std::marker::PhantomData<T>);

/// The ready event of a stream, recorded once per submission and shared by
/// the tensors on that stream.
#[derive(Default)]
pub(crate) struct ReadyEvents {
    recorded: Vec<(Arc<CudaStream>, Arc<ReadyEvent>)>,
}

impl ReadyEvents {
    /// The event recorded on `stream` by this submission (recorded now on
    /// first use).
    pub(crate) fn on(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<Arc<ReadyEvent>, cudarc::driver::DriverError> {
        if let Some((_, event)) = self.recorded.iter().find(|(s, _)| Arc::ptr_eq(s, stream)) {
            return Ok(Arc::clone(event));
        }
        let event = Arc::new(ReadyEvent::record(stream)?);
        self.recorded.push((Arc::clone(stream), Arc::clone(&event)));
        Ok(event)
    }

    /// The events recorded.
    pub(crate) fn events(&self) -> impl Iterator<Item = &ReadyEvent> {
        self.recorded.iter().map(|(_, event)| &**event)
    }
}

/// GPU memory in place: anything that is a [`DeviceTensorMut`].
macro_rules! device_mut {
    ($($ty:ty),* $(,)?) => {$(
        impl<'a, T: Element> Sealed for $ty {}
        impl<'a, T: Element> IntoTensorMut<'a> for $ty {
            type Elem = T;
            #[inline]
            fn placed(self) -> PlacedMut<'a, T> {
                PlacedMut::Device(self.into())
            }
        }
    )*};
}

device_mut!(
    &'a mut CudaSlice<T>,
    CudaViewMut<'a, T>,
    DeviceTensorMut<'a, T>
);

/// GPU memory read: anything that is a [`DeviceTensor`]; its results are
/// allocated on the engine's GPU.
macro_rules! device_ref {
    ($($ty:ty),* $(,)?) => {$(
        impl<'a, T: Element> Sealed for $ty {}
        impl<'a, T: Element> IntoTensor<'a> for $ty {
            type Elem = T;
            type Gathered = CudaSlice<T>;
            type Received = DeviceReceived<T>;
            #[inline]
            fn placed(self) -> Placed<'a, T> {
                Placed::Device(self.into())
            }
        }
    )*};
}

device_ref!(&'a CudaSlice<T>, CudaView<'a, T>, DeviceTensor<'a, T>);
