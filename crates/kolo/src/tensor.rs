//! Tensor views: a slice plus a shape. A plain slice is a 1-D tensor.
//! Shapes of up to four dimensions are held inline: a view costs no
//! allocation.

use smallvec::SmallVec;

/// A view's dimensions.
pub(crate) type Dims = SmallVec<[usize; 4]>;

/// A read-only tensor: `data` in row-major order with `shape`.
///
/// ```
/// let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
/// let t = kolo::Tensor::with_shape(&data, [2, 3]);
/// assert_eq!(t.shape(), &[2, 3]);
/// let flat: kolo::Tensor<f32> = (&data[..]).into();
/// assert_eq!(flat.shape(), &[6]);
/// ```
#[derive(Clone, Debug)]
pub struct Tensor<'a, T> {
    data: &'a [T],
    shape: Dims,
}

/// A writable tensor: `data` in row-major order with `shape`.
#[derive(Debug)]
pub struct TensorMut<'a, T> {
    data: &'a mut [T],
    shape: Dims,
}

/// What is wrong with `shape` for a buffer of `len` elements, if anything.
/// (Inline for the usual 1-D case: a group checks every tensor.)
#[inline]
pub(crate) fn shape_problem(shape: &[usize], len: usize) -> Option<String> {
    match shape {
        [only] if *only == len => None,
        _ => shape_problem_of_dims(shape, len),
    }
}

/// [`shape_problem`] for any shape.
#[cold]
#[inline(never)]
fn shape_problem_of_dims(shape: &[usize], len: usize) -> Option<String> {
    match shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) {
        Some(n) if n == len => None,
        Some(n) => Some(format!(
            "shape {shape:?} holds {n} elements, but the buffer has {len}"
        )),
        None => Some(format!(
            "the number of elements of shape {shape:?} overflows"
        )),
    }
}

impl<'a, T> Tensor<'a, T> {
    /// A view of `data` with `shape` (row-major; `[]` is a scalar). The
    /// shape is checked against the buffer when an operation is submitted;
    /// a mismatch is then an
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    pub fn with_shape(data: &'a [T], shape: impl AsRef<[usize]>) -> Self {
        Tensor {
            data,
            shape: Dims::from_slice(shape.as_ref()),
        }
    }

    /// The elements, row-major.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// What is wrong with the view, if anything.
    pub(crate) fn problem(&self) -> Option<String> {
        shape_problem(&self.shape, self.data.len())
    }
}

impl<'a, T> TensorMut<'a, T> {
    /// A writable view of `data` with `shape` (row-major); checked as in
    /// [`Tensor::with_shape`].
    pub fn with_shape(data: &'a mut [T], shape: impl AsRef<[usize]>) -> Self {
        TensorMut {
            data,
            shape: Dims::from_slice(shape.as_ref()),
        }
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[T] {
        self.data
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The buffer and the shape, for the handle that writes the result.
    pub(crate) fn into_parts(self) -> (&'a mut [T], Dims) {
        (self.data, self.shape)
    }
}

impl<'a, T> From<&'a [T]> for Tensor<'a, T> {
    fn from(data: &'a [T]) -> Self {
        Tensor {
            data,
            shape: Dims::from_buf_and_len([data.len(), 0, 0, 0], 1),
        }
    }
}

impl<'a, T> From<&'a Vec<T>> for Tensor<'a, T> {
    fn from(data: &'a Vec<T>) -> Self {
        data.as_slice().into()
    }
}

impl<'a, T, const N: usize> From<&'a [T; N]> for Tensor<'a, T> {
    fn from(data: &'a [T; N]) -> Self {
        data.as_slice().into()
    }
}

impl<'a, T> From<&'a mut [T]> for TensorMut<'a, T> {
    fn from(data: &'a mut [T]) -> Self {
        let shape = Dims::from_buf_and_len([data.len(), 0, 0, 0], 1);
        TensorMut { data, shape }
    }
}

impl<'a, T> From<&'a mut Vec<T>> for TensorMut<'a, T> {
    fn from(data: &'a mut Vec<T>) -> Self {
        data.as_mut_slice().into()
    }
}

impl<'a, T, const N: usize> From<&'a mut [T; N]> for TensorMut<'a, T> {
    fn from(data: &'a mut [T; N]) -> Self {
        data.as_mut_slice().into()
    }
}

/// The shape in the protocol's form.
pub(crate) fn wire_shape(shape: &[usize]) -> kolo_protocol::Shape {
    shape.iter().map(|&d| d as u64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_flat() {
        let mut v = vec![0u8; 5];
        assert_eq!(TensorMut::from(&mut v).shape(), &[5]);
        assert_eq!(Tensor::from(&v).shape(), &[5]);
        assert_eq!(Tensor::from(&[1, 2, 3]).shape(), &[3]);
    }

    #[test]
    fn shapes_are_checked() {
        let v = [0i32; 6];
        assert_eq!(Tensor::with_shape(&v, [2, 3]).problem(), None);
        assert_eq!(Tensor::with_shape(&[7i32], []).problem(), None);
        let wrong = Tensor::with_shape(&v, [4, 2]).problem();
        assert!(wrong.is_some_and(|p| p.contains("[4, 2] holds 8 elements, but the buffer has 6")));
        let huge = Tensor::with_shape(&v, [usize::MAX, 3]).problem();
        assert!(huge.is_some_and(|p| p.contains("overflows")));
    }
}
