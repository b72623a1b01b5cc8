//! DLPack's ABI (the legacy `DLManagedTensor`, version 0.8, which every
//! producer and consumer still speaks): reading a capsule a tensor
//! library made, and making one for memory kolo owns. Three `repr(C)`
//! structs and two functions; the `dlpark` crate would bring its own
//! pyo3 version along with them.

use kolo::raw::RawOutput;
use kolo::DataType;
use pyo3::ffi;
use std::ffi::{c_void, CStr};

/// The capsule name of an unconsumed legacy DLPack tensor.
pub(crate) const CAPSULE: &CStr = c"dltensor";

/// `DLDeviceType` values kolo reads or writes.
pub(crate) const CPU: i32 = 1;
pub(crate) const CUDA: i32 = 2;
pub(crate) const CUDA_HOST: i32 = 3;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct DLDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DLDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

#[repr(C)]
pub(crate) struct DLTensor {
    pub(crate) data: *mut c_void,
    pub(crate) device: DLDevice,
    pub(crate) ndim: i32,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: *mut i64,
    pub(crate) strides: *mut i64,
    pub(crate) byte_offset: u64,
}

#[repr(C)]
pub(crate) struct DLManagedTensor {
    pub(crate) dl_tensor: DLTensor,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `(code, bits)` of each kolo data type (`kDLInt` 0, `kDLUInt` 1,
/// `kDLFloat` 2, `kDLBfloat` 4, `kDLBool` 6), one lane.
const CODES: [(DataType, u8, u8); 11] = [
    (DataType::U8, 1, 8),
    (DataType::I8, 0, 8),
    (DataType::U16, 1, 16),
    (DataType::I16, 0, 16),
    (DataType::I32, 0, 32),
    (DataType::I64, 0, 64),
    (DataType::F16, 2, 16),
    (DataType::BF16, 4, 16),
    (DataType::F32, 2, 32),
    (DataType::F64, 2, 64),
    (DataType::Bool, 6, 8),
];

/// kolo's data type for DLPack's `dtype`, if kolo has it.
pub(crate) fn data_type(dtype: DLDataType) -> Option<DataType> {
    if dtype.lanes != 1 {
        return None;
    }
    CODES
        .iter()
        .find(|&&(_, code, bits)| (code, bits) == (dtype.code, dtype.bits))
        .map(|&(d, _, _)| d)
}

/// DLPack's `dtype` for kolo's data type.
fn dl_data_type(dtype: DataType) -> DLDataType {
    let &(_, code, bits) =
        CODES
            .iter()
            .find(|&&(d, _, _)| d == dtype)
            .unwrap_or(&(DataType::U8, 1, 8));
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// What a capsule made by [`export`] owns.
struct Exported {
    _output: RawOutput,
    shape: Vec<i64>,
}

/// The `DLManagedTensor` of `output`, owning it: the consumer's call of
/// its deleter (or the capsule's destructor, if never consumed) frees it.
pub(crate) fn export(output: RawOutput) -> *mut DLManagedTensor {
    let shape: Vec<i64> = output.shape().iter().map(|&d| d as i64).collect();
    let device = match output.device() {
        Some(gpu) => DLDevice {
            device_type: CUDA,
            device_id: gpu as i32,
        },
        None => DLDevice {
            device_type: CPU,
            device_id: 0,
        },
    };
    let mut data = output.data().cast_mut();
    if data.is_null() {
        // An empty output: consumers expect an address all the same.
        data = std::ptr::NonNull::<u64>::dangling().as_ptr().cast();
    }
    let dtype = dl_data_type(output.dtype());
    let mut owned = Box::new(Exported {
        _output: output,
        shape,
    });
    let tensor = DLTensor {
        data,
        device,
        ndim: owned.shape.len() as i32,
        dtype,
        shape: owned.shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    Box::into_raw(Box::new(DLManagedTensor {
        dl_tensor: tensor,
        manager_ctx: Box::into_raw(owned).cast(),
        deleter: Some(delete),
    }))
}

/// The deleter of [`export`]'s tensors: frees the output and the struct.
/// Needs no GIL (PyTorch may call it from any thread).
unsafe extern "C" fn delete(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: made by `Box::into_raw` in `export`; DLPack calls the
    // deleter once.
    let managed = unsafe { Box::from_raw(managed) };
    // SAFETY: `manager_ctx` is the `Exported` box `export` leaked.
    drop(unsafe { Box::from_raw(managed.manager_ctx.cast::<Exported>()) });
}

/// The destructor of a capsule holding an [`export`]ed tensor: frees it
/// unless a consumer took it (and renamed the capsule).
pub(crate) unsafe extern "C" fn drop_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule, the GIL held.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, CAPSULE.as_ptr());
            delete(managed.cast());
        }
    }
}

/// Frees an [`export`]ed tensor no capsule took.
///
/// # Safety
/// `managed` came from [`export`] and is freed nowhere else.
pub(crate) unsafe fn drop_managed(managed: *mut DLManagedTensor) {
    // SAFETY: the caller's contract.
    unsafe { delete(managed) }
}
