//! [`RawTensor`]: a tensor described by address, data type, shape and
//! memory, as a framework hands it over (a C pointer, a numpy array's
//! buffer, a DLPack capsule). Making one checks the description — never
//! the memory, which only the caller can vouch for.

use crate::error::Error;
use crate::tensor::Dims;
use kolo_protocol::DataType;
use std::ffi::c_void;

/// Where a [`RawTensor`]'s memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawMemory {
    /// Host memory.
    Host,
    /// Memory of CUDA device `device`, used in the order of `stream` (a
    /// `CUstream`'s address; 0 is the legacy default stream): the
    /// engine's work follows what was enqueued there before the call.
    Cuda {
        /// The device's ordinal.
        device: usize,
        /// The caller's stream, as an address.
        stream: usize,
    },
}

/// A tensor given by address: `elements()` values of `dtype` at `data`,
/// row-major with `shape`, in `memory`. [`RawTensor::new`] checks what
/// can be checked without touching the memory; the operations that take
/// one are `unsafe` and say what the caller vouches for.
#[derive(Clone, Debug)]
pub struct RawTensor {
    data: *mut c_void,
    dtype: DataType,
    shape: Dims,
    elements: usize,
    memory: RawMemory,
}

// SAFETY: a `RawTensor` is a description; kolo reads or writes through
// `data` only inside the `unsafe` operations, under their callers'
// guarantees, which hold whatever thread submits.
unsafe impl Send for RawTensor {}
// SAFETY: as for `Send`: shared references give no access to the memory.
unsafe impl Sync for RawTensor {}

impl RawTensor {
    /// Describes the tensor `name` (named in the errors): `dtype` values at
    /// `data` with `shape` (row-major; `[]` is a scalar) in `memory`.
    /// Errors ([`Error::InvalidArgument`], naming the tensor and the
    /// values): a negative dimension, an element or byte count that
    /// overflows, a null `data` for a tensor that has elements, an address
    /// not aligned to the data type's size.
    pub fn new(
        name: &str,
        data: *mut c_void,
        dtype: DataType,
        shape: &[i64],
        memory: RawMemory,
    ) -> Result<RawTensor, Error> {
        let invalid = |reason: String| Error::InvalidArgument {
            tensor: name.to_owned(),
            reason,
        };
        let mut dims = Dims::with_capacity(shape.len());
        for (i, &d) in shape.iter().enumerate() {
            let d = usize::try_from(d).map_err(|_| {
                invalid(format!(
                    "dimension {i} of shape {shape:?} is negative ({d})"
                ))
            })?;
            dims.push(d);
        }
        let elements = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|&n| {
                n.checked_mul(dtype.size())
                    .is_some_and(|b| b <= isize::MAX as usize)
            })
            .ok_or_else(|| {
                invalid(format!(
                    "shape {shape:?} of {} holds more bytes than memory can",
                    dtype.name()
                ))
            })?;
        if data.is_null() && elements > 0 {
            return Err(invalid(format!(
                "the data pointer is null, but shape {shape:?} holds {elements} elements"
            )));
        }
        let address = data as usize;
        if address % dtype.size() != 0 {
            return Err(invalid(format!(
                "address {address:#x} is not aligned to the {} bytes of {}",
                dtype.size(),
                dtype.name()
            )));
        }
        Ok(RawTensor {
            data,
            dtype,
            shape: dims,
            elements,
            memory,
        })
    }

    /// The address of the first element.
    pub fn data(&self) -> *mut c_void {
        self.data
    }

    /// The data type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements (1 for a scalar).
    pub fn elements(&self) -> usize {
        self.elements
    }

    /// The size in bytes.
    pub fn byte_len(&self) -> usize {
        self.elements * self.dtype.size()
    }

    /// Where the memory lives.
    pub fn memory(&self) -> RawMemory {
        self.memory
    }

    /// The elements as a host slice of `T`.
    ///
    /// # Safety
    /// The memory is host memory holding `elements()` valid `T`s (of this
    /// tensor's data type) that nothing else reads or writes for `'a`.
    pub(crate) unsafe fn host_slice<'a, T>(&self) -> &'a mut [T] {
        if self.elements == 0 {
            return &mut [];
        }
        // SAFETY: non-null and aligned (checked in `new`), `elements` `T`s
        // long and exclusively ours for `'a` (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.data.cast::<T>(), self.elements) }
    }

    /// Fails unless every byte of a host bool tensor is 0 or 1 (any other
    /// byte is not a `bool`, and reading it as one would be undefined).
    ///
    /// # Safety
    /// The memory is host memory of `byte_len()` readable bytes.
    pub(crate) unsafe fn check_bools(&self, name: &str) -> Result<(), Error> {
        if self.dtype != DataType::Bool || self.memory != RawMemory::Host || self.elements == 0 {
            return Ok(());
        }
        // SAFETY: readable for `elements` bytes (the caller's contract); a
        // bool tensor has one byte per element.
        let bytes = unsafe { std::slice::from_raw_parts(self.data.cast::<u8>(), self.elements) };
        match bytes.iter().position(|&b| b > 1) {
            None => Ok(()),
            Some(at) => Err(Error::InvalidArgument {
                tensor: name.to_owned(),
                reason: format!(
                    "element {at} of a bool tensor is the byte {}, not 0 or 1",
                    bytes[at]
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reason(e: Error) -> String {
        match e {
            Error::InvalidArgument { tensor, reason } => {
                assert_eq!(tensor, "t");
                reason
            }
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn bad_descriptions_are_named() {
        let mut x = [0f32; 6];
        let p = x.as_mut_ptr().cast::<c_void>();
        let host = RawMemory::Host;
        let t = RawTensor::new("t", p, DataType::F32, &[2, 3], host).unwrap();
        assert_eq!(
            (t.elements(), t.byte_len(), t.shape()),
            (6, 24, &[2, 3][..])
        );
        let neg = reason(RawTensor::new("t", p, DataType::F32, &[2, -3], host).unwrap_err());
        assert!(
            neg.contains("dimension 1 of shape [2, -3] is negative (-3)"),
            "{neg}"
        );
        let null = std::ptr::null_mut();
        let e = reason(RawTensor::new("t", null, DataType::F32, &[4], host).unwrap_err());
        assert!(e.contains("null") && e.contains("4 elements"), "{e}");
        assert!(RawTensor::new("t", null, DataType::F32, &[0, 5], host).is_ok());
        let odd = unsafe { p.cast::<u8>().add(1) }.cast();
        let e = reason(RawTensor::new("t", odd, DataType::F32, &[1], host).unwrap_err());
        assert!(e.contains("not aligned to the 4 bytes of f32"), "{e}");
        let big = [i64::MAX, 2];
        let e = reason(RawTensor::new("t", p, DataType::F64, &big, host).unwrap_err());
        assert!(e.contains("more bytes than memory can"), "{e}");
        let scalar = RawTensor::new("t", p, DataType::F32, &[], host).unwrap();
        assert_eq!(scalar.elements(), 1);
    }

    #[test]
    fn bools_are_checked_byte_by_byte() {
        let mut bytes = [0u8, 1, 1, 7];
        let p = bytes.as_mut_ptr().cast();
        let t = RawTensor::new("t", p, DataType::Bool, &[4], RawMemory::Host).unwrap();
        // SAFETY: `bytes` is readable for its 4 bytes.
        let e = reason(unsafe { t.check_bools("t") }.unwrap_err());
        assert!(e.contains("element 3") && e.contains("byte 7"), "{e}");
        let t = RawTensor::new("t", p, DataType::Bool, &[3], RawMemory::Host).unwrap();
        // SAFETY: as above, 3 bytes.
        assert!(unsafe { t.check_bools("t") }.is_ok());
    }

    proptest! {
        /// Any shape either describes its exact element count or is refused
        /// with a reason; never a panic.
        #[test]
        fn any_shape_is_counted_or_refused(shape in proptest::collection::vec(-3i64..1 << 40, 0..6),
                                           dtype in proptest::sample::select(DataType::ALL.to_vec())) {
            let mut word = 0u64;
            let p = (&mut word as *mut u64).cast();
            match RawTensor::new("t", p, dtype, &shape, RawMemory::Host) {
                Ok(t) => {
                    let n: u128 = shape.iter().map(|&d| d as u128).product();
                    prop_assert_eq!(t.elements() as u128, n);
                    prop_assert!(shape.iter().all(|&d| d >= 0));
                }
                Err(e) => prop_assert!(!reason(e).is_empty()),
            }
        }
    }
}
