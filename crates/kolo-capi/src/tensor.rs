//! The C tensor descriptor and its checks: every pointer, count and code
//! that comes in is checked before kolo reads through it.

use crate::status::Failure;
use kolo::raw::{RawMemory, RawTensor};
use kolo::{DataType, ReduceOp};
use std::ffi::{c_char, c_void, CStr};

/// The most dimensions a tensor may have.
pub const KOLO_MAX_DIMS: i32 = 32;
/// The longest tensor name, in bytes.
pub const KOLO_MAX_NAME: usize = 4096;

/// Unsigned 8-bit integers (the first of the data types of
/// `kolo_tensor.dtype`).
pub const KOLO_UINT8: i32 = 0;
/// Signed 8-bit integers.
pub const KOLO_INT8: i32 = 1;
/// Unsigned 16-bit integers.
pub const KOLO_UINT16: i32 = 2;
/// Signed 16-bit integers.
pub const KOLO_INT16: i32 = 3;
/// Signed 32-bit integers.
pub const KOLO_INT32: i32 = 4;
/// Signed 64-bit integers.
pub const KOLO_INT64: i32 = 5;
/// IEEE half precision.
pub const KOLO_FLOAT16: i32 = 6;
/// bfloat16.
pub const KOLO_BFLOAT16: i32 = 7;
/// IEEE single precision.
pub const KOLO_FLOAT32: i32 = 8;
/// IEEE double precision.
pub const KOLO_FLOAT64: i32 = 9;
/// Booleans, one byte each (0 or 1).
pub const KOLO_BOOL: i32 = 10;

/// The elementwise sum (the first of the reduce ops).
pub const KOLO_SUM: i32 = 0;
/// The sum divided by the number of ranks.
pub const KOLO_AVERAGE: i32 = 1;
/// The elementwise minimum.
pub const KOLO_MIN: i32 = 2;
/// The elementwise maximum.
pub const KOLO_MAX: i32 = 3;
/// The elementwise product.
pub const KOLO_PRODUCT: i32 = 4;

/// Host memory (`kolo_tensor.device`).
pub const KOLO_CPU: i32 = -1;

/// A tensor: `data` holds the product of `shape[0..ndim]` elements of
/// `dtype` (a `KOLO_*` data type), row-major, in host memory (`device`
/// `KOLO_CPU`) or on CUDA device `device`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub struct kolo_tensor {
    /// The first element (may be null for a tensor of no elements).
    pub data: *mut c_void,
    /// A `KOLO_*` data type.
    pub dtype: i32,
    /// The number of dimensions, 0 to `KOLO_MAX_DIMS` (0: a scalar).
    pub ndim: i32,
    /// `ndim` dimensions, none negative (may be null when `ndim` is 0).
    pub shape: *const i64,
    /// `KOLO_CPU`, or a CUDA device's ordinal.
    pub device: i32,
}

/// The data type of code `dtype`.
fn dtype_of(name: &str, dtype: i32) -> Result<DataType, Failure> {
    usize::try_from(dtype)
        .ok()
        .and_then(|i| DataType::ALL.get(i).copied())
        .ok_or_else(|| {
            Failure::invalid(format!(
                "tensor '{name}': unknown data type {dtype} (KOLO_UINT8 = 0 ... KOLO_BOOL = 10)"
            ))
        })
}

/// The reduce op of code `op`.
pub(crate) fn op_of(name: &str, op: i32) -> Result<ReduceOp, Failure> {
    usize::try_from(op)
        .ok()
        .and_then(|i| ReduceOp::ALL.get(i).copied())
        .ok_or_else(|| {
            Failure::invalid(format!(
                "tensor '{name}': unknown reduce op {op} (KOLO_SUM = 0 ... KOLO_PRODUCT = 4)"
            ))
        })
}

/// The name at `name`: non-null, UTF-8, NUL-terminated within
/// `KOLO_MAX_NAME` bytes.
///
/// # Safety
/// `name` is null or points to readable memory up to its terminating NUL
/// or `KOLO_MAX_NAME` bytes, whichever comes first.
pub(crate) unsafe fn name_of(name: *const c_char) -> Result<String, Failure> {
    if name.is_null() {
        return Err(Failure::invalid("a tensor's name is null"));
    }
    // Read no further than the bound: a name without its NUL must not
    // run off into the rest of memory.
    let mut len = 0;
    // SAFETY: reads byte by byte up to the NUL or the bound (the contract).
    while len < KOLO_MAX_NAME && unsafe { *name.add(len) } != 0 {
        len += 1;
    }
    if len == KOLO_MAX_NAME {
        return Err(Failure::invalid(format!(
            "a tensor's name is longer than {KOLO_MAX_NAME} bytes (or not NUL-terminated)"
        )));
    }
    // SAFETY: `len` bytes then a NUL, all readable (just read).
    let text = unsafe { CStr::from_ptr(name) };
    text.to_str()
        .map(str::to_owned)
        .map_err(|e| Failure::invalid(format!("a tensor's name is not UTF-8: {e}")))
}

/// The tensor `tensor` describes, for the tensor `name`; a CUDA tensor is
/// used in the order of `stream` (a `CUstream`, null for the default
/// stream).
///
/// # Safety
/// `tensor` is null or points to a readable `kolo_tensor` whose `shape`
/// is null or points to `ndim` readable `int64_t`s.
pub(crate) unsafe fn raw_tensor(
    name: &str,
    tensor: *const kolo_tensor,
    stream: *mut c_void,
) -> Result<RawTensor, Failure> {
    if tensor.is_null() {
        return Err(Failure::invalid(format!(
            "tensor '{name}': the descriptor is null"
        )));
    }
    // SAFETY: non-null and readable (the contract).
    let t = unsafe { *tensor };
    if !(0..=KOLO_MAX_DIMS).contains(&t.ndim) {
        return Err(Failure::invalid(format!(
            "tensor '{name}': {} dimensions (0 to {KOLO_MAX_DIMS} allowed)",
            t.ndim
        )));
    }
    if t.shape.is_null() && t.ndim > 0 {
        return Err(Failure::invalid(format!(
            "tensor '{name}': the shape is null but ndim is {}",
            t.ndim
        )));
    }
    let shape: &[i64] = if t.ndim == 0 {
        &[]
    } else {
        // SAFETY: non-null, `ndim` readable elements (the contract), and
        // `ndim` is in 1..=KOLO_MAX_DIMS.
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }
    };
    let dtype = dtype_of(name, t.dtype)?;
    let memory = match t.device {
        KOLO_CPU => RawMemory::Host,
        d if d >= 0 => RawMemory::Cuda {
            device: d as usize,
            stream: stream as usize,
        },
        d => {
            return Err(Failure::invalid(format!(
                "tensor '{name}': device {d} (KOLO_CPU = -1, or a CUDA device's ordinal)"
            )))
        }
    };
    Ok(RawTensor::new(name, t.data, dtype, shape, memory)?)
}

/// `count` entries at `list` (empty for 0).
///
/// # Safety
/// `list` is null or points to `count` readable `T`s.
pub(crate) unsafe fn list<'a, T>(
    what: &str,
    list: *const T,
    count: i32,
) -> Result<&'a [T], Failure> {
    let count = usize::try_from(count)
        .map_err(|_| Failure::invalid(format!("{what}: a negative count ({count})")))?;
    if count == 0 {
        return Ok(&[]);
    }
    if list.is_null() {
        return Err(Failure::invalid(format!(
            "{what}: null, with {count} entries"
        )));
    }
    // SAFETY: non-null, `count` readable entries (the contract).
    Ok(unsafe { std::slice::from_raw_parts(list, count) })
}
