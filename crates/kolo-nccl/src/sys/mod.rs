//! NCCL's C API as kolo-nccl loads it: the types of `nccl.h` here, and one
//! table of function pointers resolved from libnccl at run time
//! ([`api()`]). Nothing here checks a status code: that is
//! [`crate::result`]'s job.
//!
//! kolo-nccl loads NCCL itself instead of through cudarc's `nccl` module
//! for two reasons: cudarc's loader looks for `libnccl.so` and versioned
//! names derived from the CUDA version, never NCCL's own soname
//! `libnccl.so.2` (the only name pip wheels ship), and panics when nothing
//! is found; and cudarc's bindings declare `ncclRedOp_t` and `ncclResult_t`
//! as Rust enums, which cannot hold the dynamic operations
//! `ncclRedOpCreatePreMulSum` returns (or result codes of a newer NCCL)
//! without undefined behaviour. Here both are plain `c_int`s and a missing
//! library or symbol is an [`NcclError`](crate::NcclError), never a panic.
//!
//! Only functions present since NCCL 2.18 are resolved.

mod api;

pub(crate) use api::{api, Api};
use std::ffi::{c_char, c_int, c_void};

/// `ncclComm_t`: an opaque pointer to NCCL's communicator.
pub type Comm = *mut c_void;
/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclDataType_t`.
pub type DataType = c_int;
/// `ncclRedOp_t`: a built-in operation or one made by
/// `ncclRedOpCreatePreMulSum`.
pub type RedOp = c_int;

/// `ncclUniqueId`: 128 opaque bytes made on one rank and handed to all.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UniqueId {
    /// The bytes, as NCCL wrote them.
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclInProgress` (non-blocking communicators only).
pub const IN_PROGRESS: NcclResult = 7;

/// `ncclDataType_t` values.
pub mod dtype {
    use super::DataType;
    /// `ncclInt8`.
    pub const INT8: DataType = 0;
    /// `ncclUint8`.
    pub const UINT8: DataType = 1;
    /// `ncclInt32`.
    pub const INT32: DataType = 2;
    /// `ncclInt64`.
    pub const INT64: DataType = 4;
    /// `ncclFloat16`.
    pub const FLOAT16: DataType = 6;
    /// `ncclFloat32`.
    pub const FLOAT32: DataType = 7;
    /// `ncclFloat64`.
    pub const FLOAT64: DataType = 8;
    /// `ncclBfloat16`.
    pub const BFLOAT16: DataType = 9;
}

/// Built-in `ncclRedOp_t` values.
pub mod op {
    use super::RedOp;
    /// `ncclSum`.
    pub const SUM: RedOp = 0;
    /// `ncclProd`.
    pub const PROD: RedOp = 1;
    /// `ncclMax`.
    pub const MAX: RedOp = 2;
    /// `ncclMin`.
    pub const MIN: RedOp = 3;
    /// `ncclAvg`.
    pub const AVG: RedOp = 4;
}

/// `ncclScalarHostImmediate`: the PreMulSum scalar is read from host
/// memory when the collective is enqueued.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;
