//! The one error type of kolo-fusion.

use kolo_transport::TransportError;
use thiserror::Error;

/// Why a fusion operation failed.
///
/// The length variants mean the caller (kolo itself) passed buffers that do
/// not match the fused response: a kolo bug, reported instead of a panic.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum FusionError {
    /// The backend failed during the collective.
    #[error(transparent)]
    Transport(#[from] TransportError),

    /// `pack` / `unpack`: the tensors together hold a different number of
    /// elements than the fused buffer.
    #[error("{op}: the {tensors} tensors hold {total} elements in all, but the fused buffer holds {buffer}")]
    FusedLength {
        /// `"pack"` or `"unpack"`.
        op: &'static str,
        /// Number of tensors.
        tensors: usize,
        /// Sum of the tensors' lengths.
        total: usize,
        /// Length of the fused buffer.
        buffer: usize,
    },

    /// One tensor's buffer has the wrong number of elements.
    #[error("{op}: tensor {tensor} has {actual} elements, expected {expected}")]
    TensorLength {
        /// The operation (`"allgather input"`, `"reduce-scatter output"`, ...).
        op: &'static str,
        /// Index of the tensor in the fused response.
        tensor: usize,
        expected: usize,
        actual: usize,
    },

    /// A per-tensor or per-rank argument list has the wrong length.
    #[error("{op}: {what} has {actual} entries, expected {expected}")]
    ArgumentCount {
        /// The operation (`"allgather"`, `"reduce-scatter"`, ...).
        op: &'static str,
        /// Which argument (`"first_dims"`, `"counts[2]"`, ...).
        what: String,
        expected: usize,
        actual: usize,
    },

    /// Element counts derived from the response do not fit in `usize`.
    #[error("{op}: the element count of tensor {tensor} overflows")]
    Overflow {
        op: &'static str,
        /// Index of the tensor in the fused response.
        tensor: usize,
    },
}
