//! Datatypes and reduction operations: MPI's predefined ones, and the
//! calls that create and free kolo's own.

use super::{check, Datatype, Op, UserFunction};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Element, Result};
use mpi::ffi;
use std::os::raw::{c_int, c_void};

/// MPI's predefined datatype for `dtype`; `None` for f16 and bf16, which
/// MPI does not define (kolo makes its own).
pub(crate) fn predefined(dtype: DataType) -> Option<Datatype> {
    // SAFETY: reading the predefined datatype handles that rsmpi's C shim
    // exports; they are valid for the life of the MPI library.
    unsafe {
        Some(match dtype {
            DataType::U8 => ffi::RSMPI_UINT8_T,
            DataType::I8 => ffi::RSMPI_INT8_T,
            DataType::U16 => ffi::RSMPI_UINT16_T,
            DataType::I16 => ffi::RSMPI_INT16_T,
            DataType::I32 => ffi::RSMPI_INT32_T,
            DataType::I64 => ffi::RSMPI_INT64_T,
            DataType::F32 => ffi::RSMPI_FLOAT,
            DataType::F64 => ffi::RSMPI_DOUBLE,
            DataType::Bool => ffi::RSMPI_C_BOOL,
            DataType::F16 | DataType::BF16 => return None,
        })
    }
}

/// `MPI_UINT64_T` (the control plane's lengths and bit words).
pub(crate) fn uint64() -> Datatype {
    // SAFETY: reading a predefined handle exported by rsmpi's shim.
    unsafe { ffi::RSMPI_UINT64_T }
}

/// `MPI_UINT8_T` (the control plane's messages).
pub(crate) fn uint8() -> Datatype {
    // SAFETY: reading a predefined handle exported by rsmpi's shim.
    unsafe { ffi::RSMPI_UINT8_T }
}

/// MPI's predefined reduction operations that kolo uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PredefinedOp {
    Sum,
    Min,
    Max,
    Product,
    LogicalAnd,
    LogicalOr,
    BitwiseAnd,
    BitwiseOr,
}

/// The `MPI_Op` of `op`.
pub(crate) fn predefined_op(op: PredefinedOp) -> Op {
    // SAFETY: reading predefined MPI_Op handles exported by rsmpi's shim.
    unsafe {
        match op {
            PredefinedOp::Sum => ffi::RSMPI_SUM,
            PredefinedOp::Min => ffi::RSMPI_MIN,
            PredefinedOp::Max => ffi::RSMPI_MAX,
            PredefinedOp::Product => ffi::RSMPI_PROD,
            PredefinedOp::LogicalAnd => ffi::RSMPI_LAND,
            PredefinedOp::LogicalOr => ffi::RSMPI_LOR,
            PredefinedOp::BitwiseAnd => ffi::RSMPI_BAND,
            PredefinedOp::BitwiseOr => ffi::RSMPI_BOR,
        }
    }
}

/// `MPI_Type_contiguous` then `MPI_Type_commit`: a committed datatype of
/// `bytes` contiguous bytes. Local (not collective).
///
/// # Safety
/// MPI is initialised; the caller frees the result once with [`type_free`].
pub(crate) unsafe fn contiguous_bytes(bytes: c_int) -> Result<Datatype> {
    let mut ty = ffi::MPI_Datatype(std::ptr::null_mut());
    // SAFETY: `ty` is a valid out-slot; MPI_UINT8_T is predefined.
    check(
        unsafe { ffi::MPI_Type_contiguous(bytes, uint8(), &mut ty) },
        "MPI_Type_contiguous",
    )?;
    // SAFETY: `ty` was just created and is committed once.
    let committed = check(unsafe { ffi::MPI_Type_commit(&mut ty) }, "MPI_Type_commit");
    if let Err(e) = committed {
        // SAFETY: `ty` was created above and is not used again.
        let _ = unsafe { type_free(ty) };
        return Err(e);
    }
    Ok(ty)
}

/// `MPI_Type_free`.
///
/// # Safety
/// `ty` was made by [`contiguous_bytes`], MPI is still initialised, and
/// `ty` is not used again.
pub(crate) unsafe fn type_free(mut ty: Datatype) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { ffi::MPI_Type_free(&mut ty) }, "MPI_Type_free")
}

/// `MPI_Op_create` of a commutative operation. Local (not collective).
///
/// # Safety
/// MPI is initialised; `function` is sound for every datatype the
/// operation will be used with (for [`user_function::<T, _>`], datatypes
/// of `T`'s size and layout); the caller frees the result once with
/// [`op_free`].
pub(crate) unsafe fn op_create(function: UserFunction) -> Result<Op> {
    let mut op = ffi::MPI_Op(std::ptr::null_mut());
    // SAFETY: `op` is a valid out-slot; `function`'s soundness is the
    // caller's contract.
    check(
        unsafe { ffi::MPI_Op_create(function, 1, &mut op) },
        "MPI_Op_create",
    )?;
    Ok(op)
}

/// `MPI_Op_free`.
///
/// # Safety
/// `op` was made by [`op_create`], MPI is still initialised, and `op` is
/// not used again.
pub(crate) unsafe fn op_free(mut op: Op) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { ffi::MPI_Op_free(&mut op) }, "MPI_Op_free")
}

/// The reduce ops kolo runs as MPI user operations, indexed by
/// [`user_function`]'s `OP` (Average is Sum followed by a scale).
pub(crate) const USER_OPS: [ReduceOp; 4] = [
    ReduceOp::Sum,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Product,
];

/// The user function that reduces elements of `T` with `USER_OPS[OP]`
/// through kolo's kernels (f16 / bf16 accumulate in f32), for
/// [`op_create`] on a datatype of `T`'s size.
pub(crate) fn user_function<T: Element, const OP: usize>() -> UserFunction {
    Some(reduce_fn::<T, OP>)
}

/// `inout[i] = USER_OPS[OP](inout[i], in[i])` for `T`.
unsafe extern "C" fn reduce_fn<T: Element, const OP: usize>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut Datatype,
) {
    // SAFETY: MPI passes `*len` elements of the datatype this op is used
    // with — `T`-sized, as `op_create`'s contract requires — in two
    // distinct buffers.
    unsafe {
        let n = (*len).max(0) as usize;
        let src = std::slice::from_raw_parts(invec as *const T, n);
        let acc = std::slice::from_raw_parts_mut(inoutvec as *mut T, n);
        T::reduce_into(acc, src, USER_OPS[OP]);
    }
}
