//! [`DeviceTensor`] (feature `nccl`): a tensor in CUDA memory — cudarc's
//! `CudaSlice<T>` of any kolo element type, and its shape — that a
//! pipeline moves GPU to GPU over NCCL channels
//! ([`crate::Pipeline::send_device`], [`crate::Pipeline::recv_device`]).

use crate::error::TensorError;
use crate::tensor::{checked_count, Erased, Tensor};
use cudarc::driver::{CudaSlice, CudaStream};
use kolo_nccl::DeviceElement;
use kolo_protocol::DataType;
use kolo_transport::with_element_type;
use std::fmt;
use std::sync::Arc;

/// An owned, typed tensor in CUDA memory: a `CudaSlice<T>` holding the
/// elements (row-major) and a shape of up to [`crate::MAX_DIMS`]
/// dimensions, with at least one element (CUDA allocates no empty
/// buffers, and the receiver allocates one per message).
///
/// The slice lives on the GPU of its CUDA context; a send checks that it
/// is the channel's GPU. A received tensor is allocated on the receiving
/// channel's GPU, on a stream of its own (not the NCCL stream, where the
/// next receive may already wait for its peer), and cudarc's per-buffer
/// events order any later use of it after the receive.
pub struct DeviceTensor {
    shape: Vec<usize>,
    /// A `CudaSlice<T>` with `T::DTYPE == data.dtype` and `len == product(shape)`.
    data: Erased,
}

impl DeviceTensor {
    /// A tensor of `shape` holding `data`; an error if the element count
    /// differs from the shape's, is zero, or the shape has more than
    /// [`crate::MAX_DIMS`] dimensions.
    pub fn new<T: DeviceElement>(
        shape: impl Into<Vec<usize>>,
        data: CudaSlice<T>,
    ) -> Result<DeviceTensor, TensorError> {
        let shape = shape.into();
        if checked_count(&shape, T::DTYPE, data.len())? == 0 {
            return Err(TensorError::EmptyDevice { shape });
        }
        Ok(DeviceTensor {
            shape,
            data: Erased::new(T::DTYPE, data),
        })
    }

    /// A copy of the host `tensor` on `stream`'s GPU (enqueued on
    /// `stream`).
    pub fn from_host(
        stream: &Arc<CudaStream>,
        tensor: &Tensor,
    ) -> Result<DeviceTensor, TensorError> {
        with_element_type!(tensor.dtype(), T => {
            let slice = stream
                .clone_htod(tensor.as_slice::<T>()?)
                .map_err(|e| TensorError::Cuda(format!("copy to the device: {e:?}")))?;
            DeviceTensor::new(tensor.shape(), slice)
        })
    }

    /// A host copy of the tensor, made on the slice's own stream (which
    /// waits, through cudarc's events, for the buffer's last writes).
    pub fn to_host(&self) -> Result<Tensor, TensorError> {
        with_element_type!(self.dtype(), T => {
            let slice = self.as_slice::<T>()?;
            let data = slice
                .stream()
                .clone_dtoh(slice)
                .map_err(|e| TensorError::Cuda(format!("copy to the host: {e:?}")))?;
            Tensor::new(self.shape.clone(), data)
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.data.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements (at least one).
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Always false: a device tensor holds at least one element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GPU (CUDA ordinal) the elements live on.
    pub fn ordinal(&self) -> usize {
        with_element_type!(self.dtype(), T => {
            self.as_slice::<T>().map_or(0, |s| s.stream().context().ordinal())
        })
    }

    /// The elements, if they are `T`s.
    pub fn as_slice<T: DeviceElement>(&self) -> Result<&CudaSlice<T>, TensorError> {
        self.data.get::<CudaSlice<T>>(T::DTYPE)
    }

    /// The elements, mutably, if they are `T`s.
    pub fn as_mut_slice<T: DeviceElement>(&mut self) -> Result<&mut CudaSlice<T>, TensorError> {
        self.data.get_mut::<CudaSlice<T>>(T::DTYPE)
    }

    /// The elements' slice (no copy), if they are `T`s.
    pub fn into_slice<T: DeviceElement>(self) -> Result<CudaSlice<T>, TensorError> {
        self.data.take::<CudaSlice<T>>(T::DTYPE)
    }
}

impl fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceTensor")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape)
            .field("gpu", &self.ordinal())
            .finish_non_exhaustive()
    }
}
