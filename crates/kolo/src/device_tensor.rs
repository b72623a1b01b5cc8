//! Tensors in the memory of the engine's GPU, as the caller hands them in
//! (the `nccl` feature): a cudarc view plus a row-major shape, and what a
//! device alltoall delivers. The collectives take them through
//! [`crate::IntoTensorMut`] and [`crate::IntoTensor`] like host tensors.

use crate::tensor::Dims;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

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
