//! `MPI_Allreduce` in place on `MPI_COMM_WORLD`, through rsmpi's ffi: what a
//! program that uses MPI directly would call.

use super::{supports, Baseline};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Element, Result, TransportError};
use mpi::ffi::{self, MPI_Datatype, MPI_Op};
use std::os::raw::{c_int, c_void};

extern "C" {
    /// `MPI_IN_PLACE`, read through C (`src/mpi_in_place.c`).
    fn kolo_bench_mpi_in_place() -> *mut c_void;
}

/// The plain `MPI_Allreduce` baseline. Only [`crate::launcher::MpiLauncher`]
/// creates one, once MPI is initialised, and only uses it while it is.
#[derive(Debug)]
pub struct MpiAllreduce {
    _initialised: (),
}

impl MpiAllreduce {
    /// The baseline of a process in which MPI is initialised (the caller's
    /// promise; see the type's docs).
    pub(crate) fn new() -> MpiAllreduce {
        MpiAllreduce { _initialised: () }
    }
}

/// MPI's predefined datatype and operation for `dtype` and `redop` (as
/// kolo-mpi maps them: bool sum and max are OR, min and product AND).
fn mpi_types(dtype: DataType, redop: ReduceOp) -> Result<(MPI_Datatype, MPI_Op)> {
    supports(dtype, redop).map_err(TransportError::InvalidArgument)?;
    // SAFETY: reading predefined handles that rsmpi's C shim exports; they
    // are valid for the life of the MPI library.
    unsafe {
        let datatype = match dtype {
            DataType::U8 => ffi::RSMPI_UINT8_T,
            DataType::I8 => ffi::RSMPI_INT8_T,
            DataType::U16 => ffi::RSMPI_UINT16_T,
            DataType::I16 => ffi::RSMPI_INT16_T,
            DataType::I32 => ffi::RSMPI_INT32_T,
            DataType::I64 => ffi::RSMPI_INT64_T,
            DataType::F32 => ffi::RSMPI_FLOAT,
            DataType::F64 => ffi::RSMPI_DOUBLE,
            DataType::Bool => ffi::RSMPI_C_BOOL,
            DataType::F16 | DataType::BF16 => ffi::RSMPI_DATATYPE_NULL, // refused above
        };
        let op = match (dtype, redop) {
            (DataType::Bool, ReduceOp::Sum | ReduceOp::Max) => ffi::RSMPI_LOR,
            (DataType::Bool, _) => ffi::RSMPI_LAND,
            (_, ReduceOp::Min) => ffi::RSMPI_MIN,
            (_, ReduceOp::Max) => ffi::RSMPI_MAX,
            (_, ReduceOp::Product) => ffi::RSMPI_PROD,
            _ => ffi::RSMPI_SUM,
        };
        Ok((datatype, op))
    }
}

impl Baseline for MpiAllreduce {
    fn allreduce<T: Element>(&self, buf: &mut [T], redop: ReduceOp) -> Result<()> {
        let (datatype, op) = mpi_types(T::DTYPE, redop)?;
        for chunk in buf.chunks_mut(c_int::MAX as usize) {
            // SAFETY: MPI is initialised (see `MpiAllreduce`); `chunk` holds
            // `chunk.len()` (fits an int) elements of `T`, whose MPI datatype
            // is `datatype`, and MPI_IN_PLACE makes it both input and output.
            let rc = unsafe {
                ffi::MPI_Allreduce(
                    kolo_bench_mpi_in_place(),
                    chunk.as_mut_ptr() as *mut c_void,
                    chunk.len() as c_int,
                    datatype,
                    op,
                    ffi::RSMPI_COMM_WORLD,
                )
            };
            if rc != ffi::MPI_SUCCESS as c_int {
                return Err(TransportError::Backend(format!(
                    "plain MPI_Allreduce of {} {} elements failed (MPI error {rc})",
                    chunk.len(),
                    T::DTYPE
                )));
            }
        }
        Ok(())
    }
}
