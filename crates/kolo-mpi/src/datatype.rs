//! kolo's data types and reduce ops as MPI handles. f16 and bf16 have no MPI
//! type: kolo creates a 2-byte contiguous datatype for each and commutative
//! user operations that reduce through kolo's own kernels (f32 accumulation).

use crate::raw::check;
use half::{bf16, f16};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Element, Result, TransportError};
use mpi::ffi::{self, MPI_Datatype, MPI_Op};
use std::os::raw::{c_int, c_void};

/// The reduce ops MPI runs for kolo (Average is Sum followed by a scale).
const OPS: [ReduceOp; 4] = [
    ReduceOp::Sum,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Product,
];

/// Datatypes and user operations created once per communicator.
pub(crate) struct Types {
    f16: MPI_Datatype,
    bf16: MPI_Datatype,
    /// `[f16 ops, bf16 ops]`, each in the order of [`OPS`].
    half_ops: [[MPI_Op; 4]; 2],
}

impl Types {
    /// Creates the half-precision datatypes and operations.
    pub(crate) fn create() -> Result<Types> {
        let f16 = contiguous_bytes(2)?;
        let bf16 = contiguous_bytes(2)?;
        let f16_fns: [ffi::MPI_User_function; 4] = [
            Some(reduce_fn::<f16, 0>),
            Some(reduce_fn::<f16, 1>),
            Some(reduce_fn::<f16, 2>),
            Some(reduce_fn::<f16, 3>),
        ];
        let bf16_fns: [ffi::MPI_User_function; 4] = [
            Some(reduce_fn::<bf16, 0>),
            Some(reduce_fn::<bf16, 1>),
            Some(reduce_fn::<bf16, 2>),
            Some(reduce_fn::<bf16, 3>),
        ];
        let mut half_ops = [[MPI_Op(std::ptr::null_mut()); 4]; 2];
        for (row, fns) in half_ops.iter_mut().zip([f16_fns, bf16_fns]) {
            for (slot, f) in row.iter_mut().zip(fns) {
                // SAFETY: `f` is a valid MPI_User_function for 2-byte elements;
                // `slot` is a valid out-pointer. Ops are freed in Drop.
                check(unsafe { ffi::MPI_Op_create(f, 1, slot) }, "MPI_Op_create")?;
            }
        }
        Ok(Types {
            f16,
            bf16,
            half_ops,
        })
    }

    /// The MPI datatype for `dtype`.
    pub(crate) fn datatype(&self, dtype: DataType) -> MPI_Datatype {
        // SAFETY: reading the predefined datatype handles that rsmpi's C shim
        // exports; they are valid for the life of the MPI library.
        unsafe {
            match dtype {
                DataType::U8 => ffi::RSMPI_UINT8_T,
                DataType::I8 => ffi::RSMPI_INT8_T,
                DataType::U16 => ffi::RSMPI_UINT16_T,
                DataType::I16 => ffi::RSMPI_INT16_T,
                DataType::I32 => ffi::RSMPI_INT32_T,
                DataType::I64 => ffi::RSMPI_INT64_T,
                DataType::F32 => ffi::RSMPI_FLOAT,
                DataType::F64 => ffi::RSMPI_DOUBLE,
                DataType::Bool => ffi::RSMPI_C_BOOL,
                DataType::F16 => self.f16,
                DataType::BF16 => self.bf16,
            }
        }
    }

    /// The MPI operation reducing `dtype` with `op` (`Average` maps to sum).
    pub(crate) fn op(&self, dtype: DataType, op: ReduceOp) -> Result<MPI_Op> {
        let op = if op == ReduceOp::Average {
            ReduceOp::Sum
        } else {
            op
        };
        let index = OPS.iter().position(|&o| o == op).ok_or_else(|| {
            TransportError::InvalidArgument(format!("reduce op {op} has no MPI operation"))
        })?;
        // SAFETY: reading predefined MPI_Op handles exported by rsmpi's shim.
        let op = unsafe {
            match (dtype, op) {
                (DataType::F16, _) => self.half_ops[0][index],
                (DataType::BF16, _) => self.half_ops[1][index],
                // bool: sum is OR, product and min are AND, max is OR.
                (DataType::Bool, ReduceOp::Sum | ReduceOp::Max) => ffi::RSMPI_LOR,
                (DataType::Bool, _) => ffi::RSMPI_LAND,
                (_, ReduceOp::Min) => ffi::RSMPI_MIN,
                (_, ReduceOp::Max) => ffi::RSMPI_MAX,
                (_, ReduceOp::Product) => ffi::RSMPI_PROD,
                _ => ffi::RSMPI_SUM,
            }
        };
        Ok(op)
    }
}

impl Drop for Types {
    fn drop(&mut self) {
        if !crate::runtime::is_active() {
            return; // MPI already finalized: its objects are gone with it.
        }
        for op in self.half_ops.iter_mut().flatten() {
            // SAFETY: each op was created by MPI_Op_create and is freed once.
            unsafe { ffi::MPI_Op_free(op) };
        }
        for ty in [&mut self.f16, &mut self.bf16] {
            // SAFETY: each type was created and committed by us, freed once.
            unsafe { ffi::MPI_Type_free(ty) };
        }
    }
}

fn contiguous_bytes(n: c_int) -> Result<MPI_Datatype> {
    let mut ty = MPI_Datatype(std::ptr::null_mut());
    // SAFETY: out-pointer to a local; RSMPI_UINT8_T is a predefined type.
    check(
        unsafe { ffi::MPI_Type_contiguous(n, ffi::RSMPI_UINT8_T, &mut ty) },
        "MPI_Type_contiguous",
    )?;
    // SAFETY: `ty` was just created.
    check(unsafe { ffi::MPI_Type_commit(&mut ty) }, "MPI_Type_commit")?;
    Ok(ty)
}

/// MPI user function: `inout[i] = OPS[OP](inout[i], in[i])` for `T`.
unsafe extern "C" fn reduce_fn<T: Element, const OP: usize>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut MPI_Datatype,
) {
    // SAFETY: MPI passes `*len` elements of the datatype this op was created
    // for (2-byte f16/bf16 elements, matching `T`) in two distinct buffers.
    unsafe {
        let n = (*len).max(0) as usize;
        let src = std::slice::from_raw_parts(invec as *const T, n);
        let acc = std::slice::from_raw_parts_mut(inoutvec as *mut T, n);
        T::reduce_into(acc, src, OPS[OP]);
    }
}
