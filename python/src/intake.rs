//! A Python tensor as kolo's [`RawTensor`], without a copy: objects with
//! the buffer protocol (numpy arrays, `array.array`, `bytearray`) through
//! their `Py_buffer`, everything else with `__dlpack__` (torch, cupy, JAX)
//! through its DLPack capsule. What must outlive the operation (the
//! buffer view, the capsule, the object) is [`Held`] until it completed.

use crate::dlpack::{self, DLManagedTensor};
use crate::errors::{invalid, raise};
use kolo::raw::{RawMemory, RawTensor};
use kolo::DataType;
use pyo3::prelude::*;
use pyo3::{ffi, PyErr};
use std::ffi::CStr;

/// What the intake of a tensor holds until its operation completed
/// (never read: held for what dropping it releases).
#[allow(dead_code)]
pub(crate) enum Held {
    /// A Python object (the tensor, a DLPack capsule).
    Object(Py<PyAny>),
    /// A buffer view, released when dropped.
    Buffer(BufferView),
}

/// A `Py_buffer` obtained from `PyObject_GetBuffer`, released once.
pub(crate) struct BufferView(Box<ffi::Py_buffer>);

// SAFETY: the view is only read while made and released under the GIL
// (`Drop` attaches); the memory it describes is the caller's, vouched for
// by the raw calls' contract.
unsafe impl Send for BufferView {}
// SAFETY: as for `Send`; shared references read nothing.
unsafe impl Sync for BufferView {}

impl Drop for BufferView {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: filled by a successful `PyObject_GetBuffer`, released
            // once, with the GIL held.
            unsafe { ffi::PyBuffer_Release(&mut *self.0) }
        });
    }
}

/// A tensor taken in: its description and what keeps its memory alive.
pub(crate) struct Intake {
    pub(crate) tensor: RawTensor,
    pub(crate) held: Vec<Held>,
}

/// Takes `object` in as tensor `name`. `writable`: kolo writes it (in
/// place), so a read-only buffer is refused. `stream`: the CUDA stream
/// whose order a device tensor is used in (0: the legacy default).
pub(crate) fn intake(
    object: &Bound<'_, PyAny>,
    name: &str,
    writable: bool,
    stream: usize,
) -> PyResult<Intake> {
    let py = object.py();
    // SAFETY: a type check on a live object, GIL held.
    if unsafe { ffi::PyCapsule_IsValid(object.as_ptr(), dlpack::CAPSULE.as_ptr()) } == 1 {
        return from_capsule(
            object,
            name,
            stream,
            vec![Held::Object(object.clone().unbind())],
        );
    }
    // SAFETY: as above.
    if unsafe { ffi::PyObject_CheckBuffer(object.as_ptr()) } == 1 {
        return from_buffer(object, name, writable);
    }
    if object.hasattr("__dlpack__")? {
        let capsule = object.call_method0("__dlpack__")?;
        let held = vec![
            Held::Object(object.clone().unbind()),
            Held::Object(capsule.clone().unbind()),
        ];
        return from_capsule(&capsule, name, stream, held);
    }
    let kind = object.get_type().name()?;
    Err(invalid(
        py,
        format!("tensor '{name}': a {kind} is neither a buffer (a numpy array) nor a DLPack tensor (torch)"),
    ))
}

/// The buffer-protocol path.
fn from_buffer(object: &Bound<'_, PyAny>, name: &str, writable: bool) -> PyResult<Intake> {
    let py = object.py();
    // SAFETY: `Py_buffer` is plain data; `PyObject_GetBuffer` fills it.
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
    let flags = ffi::PyBUF_FORMAT | ffi::PyBUF_STRIDES;
    // SAFETY: a live object and a writable view, GIL held.
    if unsafe { ffi::PyObject_GetBuffer(object.as_ptr(), &mut *view, flags) } != 0 {
        let cause = PyErr::take(py).map(|e| e.to_string()).unwrap_or_default();
        return Err(invalid(
            py,
            format!("tensor '{name}': its buffer cannot be read ({cause})"),
        ));
    }
    let view = BufferView(view);
    let v = &*view.0;
    if writable && v.readonly != 0 {
        return Err(invalid(
            py,
            format!("tensor '{name}' is read-only, but kolo writes the result into it"),
        ));
    }
    let format = if v.format.is_null() {
        "B".to_owned()
    } else {
        // SAFETY: a NUL-terminated format string of the live view.
        unsafe { CStr::from_ptr(v.format) }
            .to_string_lossy()
            .into_owned()
    };
    let dtype = buffer_data_type(&format, v.itemsize).ok_or_else(|| {
        invalid(
            py,
            format!(
                "tensor '{name}': data type '{format}' ({} bytes) is not one kolo reduces \
                 (uint8, int8, uint16, int16, int32, int64, float16, float32, float64, bool)",
                v.itemsize
            ),
        )
    })?;
    let ndim = usize::try_from(v.ndim).unwrap_or(0);
    let shape: Vec<i64> = if v.shape.is_null() {
        vec![v.len as i64 / v.itemsize.max(1) as i64]
    } else {
        // SAFETY: `ndim` dimensions (PyBUF_STRIDES asks for the shape).
        unsafe { std::slice::from_raw_parts(v.shape, ndim) }
            .iter()
            .map(|&d| d as i64)
            .collect()
    };
    if !v.strides.is_null() {
        // SAFETY: `ndim` strides, as the shape.
        let strides: Vec<i64> = unsafe { std::slice::from_raw_parts(v.strides, ndim) }
            .iter()
            .map(|&s| s as i64)
            .collect();
        check_contiguous(py, name, &shape, &strides, v.itemsize as i64)?;
    }
    let tensor =
        RawTensor::new(name, v.buf, dtype, &shape, RawMemory::Host).map_err(|e| raise(py, e))?;
    Ok(Intake {
        tensor,
        held: vec![Held::Buffer(view), Held::Object(object.clone().unbind())],
    })
}

/// kolo's data type for a buffer format (struct module syntax, native
/// byte order) and item size.
fn buffer_data_type(format: &str, itemsize: isize) -> Option<DataType> {
    let code = format.trim_start_matches(['@', '=', '<']);
    let dtype = match code {
        "B" => DataType::U8,
        "b" => DataType::I8,
        "H" => DataType::U16,
        "h" => DataType::I16,
        "i" | "l" | "q" if itemsize == 4 => DataType::I32,
        "i" | "l" | "q" if itemsize == 8 => DataType::I64,
        "e" => DataType::F16,
        "f" => DataType::F32,
        "d" => DataType::F64,
        "?" => DataType::Bool,
        _ => return None,
    };
    (dtype.size() as isize == itemsize).then_some(dtype)
}

/// Fails unless `strides` (in bytes) lay `shape` out row-major, densely.
fn check_contiguous(
    py: Python<'_>,
    name: &str,
    shape: &[i64],
    strides: &[i64],
    itemsize: i64,
) -> PyResult<()> {
    if shape.contains(&0) {
        return Ok(());
    }
    let mut expected = itemsize;
    for (&dim, &stride) in shape.iter().zip(strides).rev() {
        if dim != 1 && stride != expected {
            return Err(invalid(
                py,
                format!(
                    "tensor '{name}' is not contiguous (shape {shape:?}, strides {strides:?} \
                     in units of {itemsize} bytes): pass a contiguous copy \
                     (numpy.ascontiguousarray, tensor.contiguous())"
                ),
            ));
        }
        expected *= dim;
    }
    Ok(())
}

/// The DLPack path: `capsule` holds an unconsumed `DLManagedTensor`,
/// which stays the capsule's (its destructor frees it) while `held`
/// keeps the capsule.
fn from_capsule(
    capsule: &Bound<'_, PyAny>,
    name: &str,
    stream: usize,
    held: Vec<Held>,
) -> PyResult<Intake> {
    let py = capsule.py();
    // SAFETY: a valid "dltensor" capsule (checked by the caller or made
    // by `__dlpack__`; a wrong one yields null and an error), GIL held.
    let managed = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), dlpack::CAPSULE.as_ptr()) }
        .cast::<DLManagedTensor>();
    if managed.is_null() {
        let cause = PyErr::take(py).map(|e| e.to_string()).unwrap_or_default();
        return Err(invalid(
            py,
            format!("tensor '{name}': not an unconsumed DLPack capsule ({cause})"),
        ));
    }
    // SAFETY: the producer's live tensor, kept by the capsule.
    let t = unsafe { &(*managed).dl_tensor };
    let dtype = dlpack::data_type(t.dtype).ok_or_else(|| {
        invalid(
            py,
            format!(
                "tensor '{name}': DLPack data type (code {}, {} bits, {} lanes) is not one kolo reduces",
                t.dtype.code, t.dtype.bits, t.dtype.lanes
            ),
        )
    })?;
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: `ndim` dimensions of the live tensor.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
    };
    if !t.strides.is_null() && ndim > 0 {
        // SAFETY: `ndim` strides (in elements) of the live tensor.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let bytes: Vec<i64> = strides.iter().map(|s| s * dtype.size() as i64).collect();
        check_contiguous(py, name, &shape, &bytes, dtype.size() as i64)?;
    }
    let memory = match t.device.device_type {
        dlpack::CPU | dlpack::CUDA_HOST => RawMemory::Host,
        dlpack::CUDA => RawMemory::Cuda {
            device: t.device.device_id as usize,
            stream,
        },
        other => {
            return Err(invalid(
                py,
                format!(
                    "tensor '{name}': DLPack device type {other} (kolo takes CPU and CUDA memory)"
                ),
            ))
        }
    };
    // SAFETY: the offset lies within the producer's allocation (DLPack's
    // contract).
    let data = unsafe { t.data.cast::<u8>().add(t.byte_offset as usize) }.cast();
    let tensor = RawTensor::new(name, data, dtype, &shape, memory).map_err(|e| raise(py, e))?;
    Ok(Intake { tensor, held })
}
