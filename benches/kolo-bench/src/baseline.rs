//! The plain library call kolo is compared with in the same run
//! (`--baseline`, `--compare` on the mpi backend): every timed iteration of
//! kolo's allreduce is paired with a plain `MPI_Allreduce` of a buffer
//! filled the same way (alternating which goes first), timed the same way,
//! so one `mpirun` prints both and a changing machine load hits both alike.

use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Element, Result};

#[cfg(feature = "mpi")]
mod mpi;

#[cfg(feature = "mpi")]
pub use self::mpi::MpiAllreduce;

/// A plain-library allreduce measured next to the backend's.
pub trait Baseline: Sync {
    /// Reduces `buf` in place across every rank with `redop` (one of those
    /// [`supports`] accepts for `T`).
    fn allreduce<T: Element>(&self, buf: &mut [T], redop: ReduceOp) -> Result<()>;
}

/// No baseline (the type of a run without one; it has no value).
#[derive(Clone, Copy, Debug)]
pub enum NoBaseline {}

impl Baseline for NoBaseline {
    fn allreduce<T: Element>(&self, _: &mut [T], _: ReduceOp) -> Result<()> {
        match *self {}
    }
}

/// Whether plain MPI can reduce `dtype` with `redop` by itself, or why not:
/// MPI has no 16-bit float types (kolo brings its own datatype and
/// reduction for them) and no average (kolo sums, then scales).
pub fn supports(dtype: DataType, redop: ReduceOp) -> std::result::Result<(), String> {
    if matches!(dtype, DataType::F16 | DataType::BF16) {
        return Err(format!(
            "plain MPI has no {dtype} datatype (kolo reduces {dtype} with its own); use another --dtype"
        ));
    }
    if redop == ReduceOp::Average {
        return Err(
            "plain MPI has no average reduction (kolo sums, then scales); use another --redop"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_types_and_ops_only() {
        for dtype in DataType::ALL {
            for redop in ReduceOp::ALL {
                let ok = supports(dtype, redop).is_ok();
                let native =
                    !matches!(dtype, DataType::F16 | DataType::BF16) && redop != ReduceOp::Average;
                assert_eq!(ok, native, "{dtype} {redop}");
            }
        }
        let why = supports(DataType::BF16, ReduceOp::Sum).unwrap_err();
        assert!(why.contains("bf16"), "{why}");
    }
}
