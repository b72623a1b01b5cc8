//! Why the requests for one tensor cannot become an op response.

use crate::types::{Compression, DataType, Device, ReduceOp, RequestKind};

/// A validation failure. Every variant names the tensor; a conflict between
/// two ranks names both ranks and both values, always the lowest-ranked
/// request (`rank_a`) against the first higher rank that differs from it
/// (`rank_b`). The `Display` text is the error message the ranks receive.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// `validate` was called with no request at all.
    #[error("No requests to validate.")]
    NoRequests,
    /// A request names a rank outside the world.
    #[error(
        "Rank {rank} sent a request for tensor '{tensor}', but the world size is {world_size}."
    )]
    RankOutOfRange {
        /// The tensor's name.
        tensor: String,
        /// The lowest rank that is out of range.
        rank: u32,
        /// The number of ranks.
        world_size: u32,
    },
    /// One rank sent two requests for the same tensor.
    #[error("Rank {rank} sent more than one request for tensor '{tensor}'.")]
    DuplicateRank {
        /// The tensor's name.
        tensor: String,
        /// The lowest rank that sent a duplicate.
        rank: u32,
    },
    /// The requests grouped under one name carry different names.
    #[error("Mismatched tensor names: rank {rank_a} sent '{a}', but rank {rank_b} sent '{b}'.")]
    NameMismatch {
        /// Lowest rank.
        rank_a: u32,
        /// Its tensor name.
        a: String,
        /// First rank that differs.
        rank_b: u32,
        /// Its tensor name.
        b: String,
    },
    /// The ranks asked for different collectives.
    #[error("Mismatched collective operations for tensor '{tensor}': rank {rank_a} requested {a}, but rank {rank_b} requested {b}.")]
    KindMismatch {
        /// The tensor's name.
        tensor: String,
        /// Lowest rank.
        rank_a: u32,
        /// Its collective.
        a: RequestKind,
        /// First rank that differs.
        rank_b: u32,
        /// Its collective.
        b: RequestKind,
    },
    /// The ranks sent different element types.
    #[error("Mismatched {kind} data types for tensor '{tensor}': rank {rank_a} sent {a}, but rank {rank_b} sent {b}.")]
    DtypeMismatch {
        /// The collective.
        kind: RequestKind,
        /// The tensor's name.
        tensor: String,
        /// Lowest rank.
        rank_a: u32,
        /// Its data type.
        a: DataType,
        /// First rank that differs.
        rank_b: u32,
        /// Its data type.
        b: DataType,
    },
    /// Some ranks sent host tensors, others GPU tensors.
    #[error("Mismatched {kind} CPU/GPU device selection for tensor '{tensor}': rank {rank_a} sent {a}, but rank {rank_b} sent {b}.")]
    DeviceMismatch {
        /// The collective.
        kind: RequestKind,
        /// The tensor's name.
        tensor: String,
        /// Lowest rank.
        rank_a: u32,
        /// Its device.
        a: Device,
        /// First rank whose device is on the other side of CPU/GPU.
        rank_b: u32,
        /// Its device.
        b: Device,
    },
    /// The ranks asked for different reductions.
    #[error("Mismatched {kind} reduce operations for tensor '{tensor}': rank {rank_a} sent {a}, but rank {rank_b} sent {b}.")]
    ReduceOpMismatch {
        /// The collective.
        kind: RequestKind,
        /// The tensor's name.
        tensor: String,
        /// Lowest rank.
        rank_a: u32,
        /// Its reduce op.
        a: ReduceOp,
        /// First rank that differs.
        rank_b: u32,
        /// Its reduce op.
        b: ReduceOp,
    },
    /// The ranks asked for different compressions.
    #[error("Mismatched {kind} compressions for tensor '{tensor}': rank {rank_a} sent {a}, but rank {rank_b} sent {b}.")]
    CompressionMismatch {
        /// The collective.
        kind: RequestKind,
        /// The tensor's name.
        tensor: String,
        /// Lowest rank.
        rank_a: u32,
        /// Its compression.
        a: Compression,
        /// First rank that differs.
        rank_b: u32,
        /// Its compression.
        b: Compression,
    },
    /// The ranks sent different prescale or postscale factors (compared
    /// bitwise, so NaN matches NaN and 0.0 differs from -0.0).
    #[error("Mismatched {kind} {which} factors for tensor '{tensor}': rank {rank_a} sent {a:?}, but rank {rank_b} sent {b:?}.")]
    ScaleMismatch {
        /// The collective.
        kind: RequestKind,
        /// `"prescale"` or `"postscale"`.
        which: &'static str,
        /// The tensor's name.
        tensor: String,
        /// Lowest rank.
        rank_a: u32,
        /// Its factor.
        a: f64,
        /// First rank that differs.
        rank_b: u32,
        /// Its factor.
        b: f64,
    },
    /// The ranks sent different shapes where they must agree.
    #[error("Mismatched {kind} tensor shapes for tensor '{tensor}': rank {rank_a} sent {a:?}, but rank {rank_b} sent {b:?}.")]
    ShapeMismatch {
        /// The collective.
        kind: RequestKind,
        /// The tensor's name.
        tensor: String,
        /// Lowest rank.
        rank_a: u32,
        /// Its shape.
        a: Vec<u64>,
        /// First rank that differs.
        rank_b: u32,
        /// Its shape.
        b: Vec<u64>,
    },
    /// The ranks sent tensors with different numbers of dimensions
    /// (allgather, alltoall).
    #[error("Mismatched {kind} tensor ranks for tensor '{tensor}': rank {rank_a} sent {a:?} ({} dimensions), but rank {rank_b} sent {b:?} ({} dimensions).", .a.len(), .b.len())]
    DimensionCountMismatch {
        /// The collective.
        kind: RequestKind,
        /// The tensor's name.
        tensor: String,
        /// Lowest rank.
        rank_a: u32,
        /// Its shape.
        a: Vec<u64>,
        /// First rank that differs.
        rank_b: u32,
        /// Its shape.
        b: Vec<u64>,
    },
    /// The ranks sent shapes that differ beyond the first dimension
    /// (allgather, alltoall).
    #[error("Mismatched {kind} tensor shapes for tensor '{tensor}' in dimension {dim}: rank {rank_a} sent {a:?}, but rank {rank_b} sent {b:?}.")]
    TrailingDimMismatch {
        /// The collective.
        kind: RequestKind,
        /// The tensor's name.
        tensor: String,
        /// The first dimension (counting from 0, always >= 1) that differs.
        dim: usize,
        /// Lowest rank.
        rank_a: u32,
        /// Its shape.
        a: Vec<u64>,
        /// First rank that differs.
        rank_b: u32,
        /// Its shape.
        b: Vec<u64>,
    },
    /// A collective that splits the first dimension got a scalar.
    #[error("{kind} of tensor '{tensor}' needs at least one dimension, but rank {rank} sent a scalar (shape []).")]
    ScalarTensor {
        /// The collective.
        kind: RequestKind,
        /// The tensor's name.
        tensor: String,
        /// The lowest rank that sent a scalar.
        rank: u32,
    },
    /// A shape whose element count does not fit in `u64`.
    #[error("{kind} of tensor '{tensor}': rank {rank} sent shape {shape:?}, whose number of elements overflows u64.")]
    ElementCountOverflow {
        /// The collective.
        kind: RequestKind,
        /// The tensor's name.
        tensor: String,
        /// The lowest rank with such a shape.
        rank: u32,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// The ranks named different broadcast roots.
    #[error("Mismatched BROADCAST root ranks for tensor '{tensor}': rank {rank_a} sent root {a}, but rank {rank_b} sent root {b}.")]
    RootRankMismatch {
        /// The tensor's name.
        tensor: String,
        /// Lowest rank.
        rank_a: u32,
        /// Its root rank.
        a: u32,
        /// First rank that differs.
        rank_b: u32,
        /// Its root rank.
        b: u32,
    },
    /// The broadcast root is outside the world.
    #[error("BROADCAST of tensor '{tensor}': rank {rank} sent root rank {root}, but the world size is {world_size}.")]
    RootRankOutOfRange {
        /// The tensor's name.
        tensor: String,
        /// The lowest rank (all ranks agree on the root).
        rank: u32,
        /// The root rank.
        root: u32,
        /// The number of ranks.
        world_size: u32,
    },
    /// Alltoall splits with other than `world_size` entries.
    #[error("ALLTOALL of tensor '{tensor}': rank {rank} sent {} splits {splits:?}, but the world size is {world_size}.", .splits.len())]
    SplitCount {
        /// The tensor's name.
        tensor: String,
        /// The lowest offending rank.
        rank: u32,
        /// Its splits.
        splits: Vec<u64>,
        /// The number of ranks.
        world_size: u32,
    },
    /// Alltoall splits that do not sum to the first dimension.
    #[error("ALLTOALL of tensor '{tensor}': rank {rank} sent splits {splits:?} summing to {sum}, but its first dimension is {first_dim}.")]
    SplitSum {
        /// The tensor's name.
        tensor: String,
        /// The lowest offending rank.
        rank: u32,
        /// Its splits.
        splits: Vec<u64>,
        /// Their sum (exact: u128 cannot overflow here).
        sum: u128,
        /// Its tensor's first dimension.
        first_dim: u64,
    },
    /// An even alltoall split of a first dimension that does not divide.
    #[error("ALLTOALL of tensor '{tensor}': rank {rank} sent no splits, but its first dimension {first_dim} does not divide evenly among {world_size} ranks.")]
    UnevenSplit {
        /// The tensor's name.
        tensor: String,
        /// The lowest offending rank.
        rank: u32,
        /// Its tensor's first dimension.
        first_dim: u64,
        /// The number of ranks.
        world_size: u32,
    },
}
