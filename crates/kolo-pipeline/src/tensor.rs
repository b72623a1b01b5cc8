//! [`Tensor`]: an owned, typed, shaped buffer — what a stage sends and
//! what a receive returns.

use crate::error::TensorError;
use kolo_protocol::DataType;
use kolo_transport::{byte_view, with_element_type, Element};
use std::any::Any;
use std::fmt;

/// The most dimensions a tensor may have (the wire header's room).
pub const MAX_DIMS: usize = 8;

/// An owned tensor on the host: element type, shape and elements. Any
/// [`Element`] type can be held (f32, bf16, i64 labels, ...); the typed
/// accessors fail with [`TensorError::DType`] naming both types when asked
/// for another.
///
/// ```
/// use kolo_pipeline::Tensor;
/// use kolo_protocol::DataType;
///
/// let labels = Tensor::new([2, 2], vec![1i64, 0, 3, 2])?;
/// assert_eq!((labels.dtype(), labels.shape()), (DataType::I64, &[2, 2][..]));
/// assert_eq!(labels.as_slice::<i64>()?, &[1, 0, 3, 2]);
/// let err = labels.as_slice::<f32>().unwrap_err();
/// assert_eq!(err.to_string(), "the tensor holds i64 elements, not f32");
/// # Ok::<(), kolo_pipeline::TensorError>(())
/// ```
pub struct Tensor {
    shape: Vec<usize>,
    /// A `Vec<T>` with `T::DTYPE == data.dtype` and `len == product(shape)`.
    data: Erased,
}

impl Tensor {
    /// A tensor of `shape` holding `data` (row-major); an error if the
    /// element count differs from the shape's or the shape has more than
    /// [`MAX_DIMS`] dimensions.
    pub fn new<T: Element>(
        shape: impl Into<Vec<usize>>,
        data: Vec<T>,
    ) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        checked_count(&shape, T::DTYPE, data.len())?;
        Ok(Tensor {
            shape,
            data: Erased::new(T::DTYPE, data),
        })
    }

    /// A tensor of `shape` holding a copy of `data`.
    pub fn from_slice<T: Element>(
        shape: impl Into<Vec<usize>>,
        data: &[T],
    ) -> Result<Tensor, TensorError> {
        Tensor::new(shape, data.to_vec())
    }

    /// A tensor of `dtype` and `shape` from its bytes (native endianness,
    /// as [`Tensor::as_bytes`] gives them).
    pub fn from_bytes(
        dtype: DataType,
        shape: Vec<usize>,
        bytes: &[u8],
    ) -> Result<Tensor, TensorError> {
        let count = element_count(&shape, dtype)?;
        with_element_type!(dtype, T => {
            let mut data = vec![T::default(); count];
            byte_view::copy_from_bytes(&mut data, bytes)
                .map_err(|e| TensorError::Bytes(e.to_string()))?;
            Ok(Tensor { shape, data: Erased::new(dtype, data) })
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

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements, if they are `T`s.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], TensorError> {
        self.data.get::<Vec<T>>(T::DTYPE).map(Vec::as_slice)
    }

    /// The elements, mutably, if they are `T`s.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], TensorError> {
        self.data.get_mut::<Vec<T>>(T::DTYPE).map(Vec::as_mut_slice)
    }

    /// The elements as a vector (no copy), if they are `T`s.
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>, TensorError> {
        self.data.take::<Vec<T>>(T::DTYPE)
    }

    /// The elements' bytes, native endianness.
    pub fn as_bytes(&self) -> &[u8] {
        with_element_type!(self.dtype(), T => {
            // Construction guarantees `data` is a `Vec<T>` of `dtype`.
            self.as_slice::<T>().map_or(&[][..], byte_view::as_bytes)
        })
    }
}

/// Elements in `shape`, checking the dimension count and that the byte
/// size is addressable.
pub(crate) fn element_count(shape: &[usize], dtype: DataType) -> Result<usize, TensorError> {
    if shape.len() > MAX_DIMS {
        return Err(TensorError::TooManyDims {
            ndim: shape.len(),
            max: MAX_DIMS,
        });
    }
    let too_large = || TensorError::TooLarge {
        shape: shape.to_vec(),
        dtype,
    };
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_large)?;
    match count.checked_mul(dtype.size()) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(count),
        _ => Err(too_large()),
    }
}

/// `element_count(shape, dtype)`, checked against the `got` elements a
/// buffer holds (host and device tensors alike).
pub(crate) fn checked_count(
    shape: &[usize],
    dtype: DataType,
    got: usize,
) -> Result<usize, TensorError> {
    let expected = element_count(shape, dtype)?;
    if expected != got {
        return Err(TensorError::Shape {
            shape: shape.to_vec(),
            expected,
            got,
        });
    }
    Ok(expected)
}

/// The buffer of a tensor, type-erased, with the dtype it was made from:
/// `V` is `Vec<T>` for host tensors, `CudaSlice<T>` for device ones.
pub(crate) struct Erased {
    pub(crate) dtype: DataType,
    data: Box<dyn Any + Send + Sync>,
}

impl Erased {
    pub(crate) fn new<V: Any + Send + Sync>(dtype: DataType, data: V) -> Erased {
        Erased {
            dtype,
            data: Box::new(data),
        }
    }

    fn wrong(&self, requested: DataType) -> TensorError {
        TensorError::DType {
            holds: self.dtype,
            requested,
        }
    }

    /// The buffer, if it is a `V` (of element type `requested`).
    pub(crate) fn get<V: Any>(&self, requested: DataType) -> Result<&V, TensorError> {
        self.data
            .downcast_ref::<V>()
            .ok_or_else(|| self.wrong(requested))
    }

    /// The buffer, mutably, if it is a `V`.
    pub(crate) fn get_mut<V: Any>(&mut self, requested: DataType) -> Result<&mut V, TensorError> {
        let wrong = self.wrong(requested);
        self.data.downcast_mut::<V>().ok_or(wrong)
    }

    /// The buffer itself, if it is a `V`.
    pub(crate) fn take<V: Any>(self, requested: DataType) -> Result<V, TensorError> {
        let wrong = self.wrong(requested);
        self.data.downcast::<V>().map(|v| *v).map_err(|_| wrong)
    }
}

impl Clone for Tensor {
    fn clone(&self) -> Self {
        with_element_type!(self.dtype(), T => {
            let data: Vec<T> = self.as_slice::<T>().map(<[T]>::to_vec).unwrap_or_default();
            Tensor { shape: self.shape.clone(), data: Erased::new(self.dtype(), data) }
        })
    }
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.dtype() == other.dtype()
            && self.shape == other.shape
            && self.as_bytes() == other.as_bytes()
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn round_trips_through_bytes_for_every_kind() {
        let t = Tensor::new(
            [3],
            vec![bf16::from_f32(1.5), bf16::ZERO, bf16::from_f32(-2.0)],
        )
        .unwrap();
        let back = Tensor::from_bytes(DataType::BF16, vec![3], t.as_bytes()).unwrap();
        assert_eq!(back, t);
        let labels = Tensor::new([2, 1], vec![7i64, -1]).unwrap();
        let back = Tensor::from_bytes(DataType::I64, vec![2, 1], labels.as_bytes()).unwrap();
        assert_eq!(back.into_vec::<i64>().unwrap(), [7, -1]);
        let flags = Tensor::new([2], vec![true, false]).unwrap();
        assert_eq!(flags.as_bytes(), &[1, 0]);
        assert_eq!(flags.clone(), flags);
    }

    #[test]
    fn bad_shapes_and_bytes_are_errors() {
        let err = Tensor::new([2, 3], vec![0f32; 5]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "shape [2, 3] holds 6 elements, but 5 were given"
        );
        let err = Tensor::new(vec![1; 9], vec![0u8]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a tensor may have at most 8 dimensions, this one has 9"
        );
        let err = Tensor::from_bytes(DataType::F32, vec![usize::MAX, 2], &[]).unwrap_err();
        assert!(matches!(err, TensorError::TooLarge { .. }), "{err}");
        let err = Tensor::from_bytes(DataType::Bool, vec![2], &[1, 2]).unwrap_err();
        assert!(err.to_string().contains("not 0 or 1"), "{err}");
        let err = Tensor::from_bytes(DataType::I32, vec![2], &[0; 7]).unwrap_err();
        assert!(err.to_string().contains("received 7 bytes"), "{err}");
    }

    #[test]
    fn typed_access_names_both_types() {
        let mut t = Tensor::new([2], vec![1.0f32, 2.0]).unwrap();
        t.as_mut_slice::<f32>().unwrap()[1] = 5.0;
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0, 5.0]);
        let err = t.into_vec::<bf16>().unwrap_err();
        assert_eq!(err.to_string(), "the tensor holds f32 elements, not bf16");
        let empty = Tensor::new([0, 4], Vec::<u8>::new()).unwrap();
        assert!(empty.is_empty());
    }
}
