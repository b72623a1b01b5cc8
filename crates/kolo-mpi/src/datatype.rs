//! kolo's data types and reduce ops as MPI handles. f16 and bf16 have no MPI
//! type: kolo creates a 2-byte contiguous datatype for each and commutative
//! user operations that reduce through kolo's own kernels (f32 accumulation).

use crate::raw::datatype::{self as raw, user_function, PredefinedOp, USER_OPS};
use crate::raw::{Datatype, Op, UserFunction};
use half::{bf16, f16};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Element, Result, TransportError};

/// Datatypes and user operations created once per communicator, freed
/// when dropped.
pub(crate) struct Types {
    f16: DerivedType,
    bf16: DerivedType,
    /// Each in the order of [`USER_OPS`].
    f16_ops: Vec<UserOp>,
    bf16_ops: Vec<UserOp>,
}

impl Types {
    /// Creates the half-precision datatypes and operations (local calls,
    /// not collective). A failure part-way frees what was made.
    pub(crate) fn create() -> Result<Types> {
        Ok(Types {
            f16: DerivedType::bytes(2)?,
            bf16: DerivedType::bytes(2)?,
            f16_ops: user_ops::<f16>()?,
            bf16_ops: user_ops::<bf16>()?,
        })
    }

    /// The MPI datatype for `dtype`.
    pub(crate) fn datatype(&self, dtype: DataType) -> Datatype {
        match (dtype, raw::predefined(dtype)) {
            (_, Some(predefined)) => predefined,
            (DataType::BF16, None) => self.bf16.0,
            // F16, the other type MPI does not define.
            (_, None) => self.f16.0,
        }
    }

    /// The MPI operation reducing `dtype` with `op` (`Average` maps to sum).
    pub(crate) fn op(&self, dtype: DataType, op: ReduceOp) -> Result<Op> {
        let op = if op == ReduceOp::Average {
            ReduceOp::Sum
        } else {
            op
        };
        let index = USER_OPS.iter().position(|&o| o == op).ok_or_else(|| {
            TransportError::InvalidArgument(format!("reduce op {op} has no MPI operation"))
        })?;
        let predefined = match (dtype, op) {
            (DataType::F16, _) => return Ok(self.f16_ops[index].0),
            (DataType::BF16, _) => return Ok(self.bf16_ops[index].0),
            // bool: sum is OR, product and min are AND, max is OR.
            (DataType::Bool, ReduceOp::Sum | ReduceOp::Max) => PredefinedOp::LogicalOr,
            (DataType::Bool, _) => PredefinedOp::LogicalAnd,
            (_, ReduceOp::Min) => PredefinedOp::Min,
            (_, ReduceOp::Max) => PredefinedOp::Max,
            (_, ReduceOp::Product) => PredefinedOp::Product,
            _ => PredefinedOp::Sum,
        };
        Ok(raw::predefined_op(predefined))
    }
}

/// The user operations reducing `T`, in the order of [`USER_OPS`].
fn user_ops<T: Element>() -> Result<Vec<UserOp>> {
    let functions: [UserFunction; USER_OPS.len()] = [
        user_function::<T, 0>(),
        user_function::<T, 1>(),
        user_function::<T, 2>(),
        user_function::<T, 3>(),
    ];
    functions
        .into_iter()
        .map(|function| {
            // SAFETY: MPI is initialised (`Types` are made after `Runtime`);
            // each function reduces `T`, and `Types::op` hands its operation
            // out only for `T::DTYPE`, whose datatype (`Types::datatype`) is
            // `T`-sized; the operation is freed once, by `Drop`.
            unsafe { raw::op_create(function) }.map(UserOp)
        })
        .collect()
}

/// A committed datatype of contiguous bytes, freed when dropped.
struct DerivedType(Datatype);

impl DerivedType {
    fn bytes(n: i32) -> Result<DerivedType> {
        // SAFETY: MPI is initialised (`Types` are made after `Runtime`);
        // the datatype is freed once, by `Drop`.
        unsafe { raw::contiguous_bytes(n) }.map(DerivedType)
    }
}

impl Drop for DerivedType {
    fn drop(&mut self) {
        if crate::runtime::is_active() {
            // SAFETY: made by `bytes` for this value alone, not used after.
            // A failure cannot be reported from a drop; MPI reclaims the
            // datatype at finalisation.
            let _ = unsafe { raw::type_free(self.0) };
        }
    }
}

/// A commutative user operation, freed when dropped.
struct UserOp(Op);

impl Drop for UserOp {
    fn drop(&mut self) {
        if crate::runtime::is_active() {
            // SAFETY: made by `user_ops` for this value alone, not used after.
            // A failure cannot be reported from a drop; MPI reclaims the
            // operation at finalisation.
            let _ = unsafe { raw::op_free(self.0) };
        }
    }
}
