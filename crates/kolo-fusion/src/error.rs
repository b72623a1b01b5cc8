//! The one error type of kolo-fusion.

use kolo_protocol::{DataType, Device};
use kolo_transport::TransportError;
use thiserror::Error;

/// Why a fusion operation failed.
///
/// The length variants mean the caller (kolo itself) passed buffers that do
/// not match the fused response: a kolo bug, reported instead of a panic.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum FusionError {
    /// The backend failed: allocating a fusion buffer, copying into or out
    /// of it, or in the collective.
    #[error(transparent)]
    Transport(#[from] TransportError),

    /// `pack` / `unpack`: the tensors together hold fewer elements than the
    /// fused buffer (more is [`FusionError::SegmentPastEnd`]).
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

    /// `pack` / `unpack`: a tensor, laid out after the ones before it,
    /// runs past the end of the fused buffer.
    #[error("{op}: tensor {tensor} (elements {start}..{end}) runs past the end of the fused buffer of {buffer} elements", end = start.saturating_add(*len))]
    SegmentPastEnd {
        /// `"pack"` or `"unpack"`.
        op: &'static str,
        /// Index of the tensor.
        tensor: usize,
        /// Where the tensor begins in the fused buffer.
        start: usize,
        /// The tensor's length.
        len: usize,
        /// Length of the fused buffer.
        buffer: usize,
    },

    /// The memory's backend allocated a buffer (a fusion buffer, an
    /// allgather's output) shorter than asked for: a bug of the backend,
    /// reported before anything is copied.
    #[error("{what} of {dtype} on {device}: {requested} elements were asked for, but the memory allocated {allocated}")]
    ShortAllocation {
        /// Which buffer (`"the fusion buffer"`, `"allgather output 2"`).
        what: String,
        /// The buffer's device.
        device: Device,
        /// The buffer's element type.
        dtype: DataType,
        /// Elements asked for.
        requested: usize,
        /// Elements the allocation holds.
        allocated: usize,
    },

    /// The two pieces of a fusion buffer (send and receive) hold more than
    /// `usize::MAX` elements together.
    #[error("the fusion buffer of {dtype} on {device}: pieces of {first} and {second} elements overflow usize")]
    BufferOverflow {
        /// The buffer's device.
        device: Device,
        /// The buffer's element type.
        dtype: DataType,
        /// Elements of the first piece.
        first: usize,
        /// Elements of the second piece.
        second: usize,
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
