//! The scalar vocabulary shared by every kolo crate: data types, reduce
//! operations, devices and the kinds of collective request.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DataType {
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE 754 half precision (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
    /// A boolean, one byte (0 or 1).
    Bool,
}

impl DataType {
    /// Every data type, in declaration order.
    pub const ALL: [DataType; 11] = [
        DataType::U8,
        DataType::I8,
        DataType::U16,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::F16,
        DataType::BF16,
        DataType::F32,
        DataType::F64,
        DataType::Bool,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::U8 | DataType::I8 | DataType::Bool => 1,
            DataType::U16 | DataType::I16 | DataType::F16 | DataType::BF16 => 2,
            DataType::I32 | DataType::F32 => 4,
            DataType::I64 | DataType::F64 => 8,
        }
    }

    /// True for f16, bf16, f32 and f64.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::BF16 | DataType::F32 | DataType::F64
        )
    }

    /// The lower-case name used in messages, flags and the timeline.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::U8 => "u8",
            DataType::I8 => "i8",
            DataType::U16 => "u16",
            DataType::I16 => "i16",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::Bool => "bool",
        }
    }

    /// Parses the name printed by [`DataType::name`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<DataType> {
        DataType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an allreduce's floating-point data travels (Horovod's
/// `Compression`): cast to a 16-bit type before the collective and back
/// after it, halving the bytes moved at the cost of precision. Applies to
/// `f32` and `f64` tensors; others travel as they are.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Compression {
    /// As they are.
    #[default]
    None,
    /// IEEE half precision (`f16`): 10 bits of mantissa, values up to
    /// 65504.
    Fp16,
    /// `bfloat16`: `f32`'s range, 7 bits of mantissa.
    Bf16,
}

impl Compression {
    /// Every compression, in declaration order.
    pub const ALL: [Compression; 3] = [Compression::None, Compression::Fp16, Compression::Bf16];

    /// The lower-case name used in messages and flags.
    pub const fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Fp16 => "fp16",
            Compression::Bf16 => "bf16",
        }
    }

    /// Parses the name printed by [`Compression::name`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<Compression> {
        let name = name.to_ascii_lowercase();
        Compression::ALL.into_iter().find(|c| c.name() == name)
    }

    /// True when a tensor of `dtype` travels compressed.
    pub const fn applies_to(self, dtype: DataType) -> bool {
        !matches!(self, Compression::None) && matches!(dtype, DataType::F32 | DataType::F64)
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the elements contributed by the ranks are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Sum divided by the number of ranks.
    Average,
    /// Elementwise minimum.
    Min,
    /// Elementwise maximum.
    Max,
    /// Elementwise product.
    Product,
}

impl ReduceOp {
    /// Every reduce op, in declaration order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Average,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Product,
    ];

    /// The lower-case name used in messages and flags.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Average => "average",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Product => "product",
        }
    }

    /// Parses the name printed by [`ReduceOp::name`] (case-insensitive; `avg`
    /// and `prod` are accepted too).
    pub fn from_name(name: &str) -> Option<ReduceOp> {
        match name.to_ascii_lowercase().as_str() {
            "avg" => Some(ReduceOp::Average),
            "prod" => Some(ReduceOp::Product),
            n => ReduceOp::ALL.into_iter().find(|o| o.name() == n),
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(u32),
}

impl Device {
    /// True for host memory.
    pub const fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The collective a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RequestKind {
    /// Reduce across ranks; every rank gets the result.
    Allreduce,
    /// Concatenate every rank's tensor along the first dimension.
    Allgather,
    /// Copy the root rank's tensor to every rank.
    Broadcast,
    /// Reduce across ranks; each rank gets one slice of the first dimension.
    ReduceScatter,
    /// Each rank sends slices of its first dimension to every rank.
    Alltoall,
    /// Wait until every rank arrives.
    Barrier,
    /// The rank has no more batches; others go on without it.
    Join,
}

impl RequestKind {
    /// Every request kind, in declaration order.
    pub const ALL: [RequestKind; 7] = [
        RequestKind::Allreduce,
        RequestKind::Allgather,
        RequestKind::Broadcast,
        RequestKind::ReduceScatter,
        RequestKind::Alltoall,
        RequestKind::Barrier,
        RequestKind::Join,
    ];

    /// The upper-case name used in messages and on the timeline (Horovod's
    /// spelling: `ALLREDUCE`, `REDUCESCATTER`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            RequestKind::Allreduce => "ALLREDUCE",
            RequestKind::Allgather => "ALLGATHER",
            RequestKind::Broadcast => "BROADCAST",
            RequestKind::ReduceScatter => "REDUCESCATTER",
            RequestKind::Alltoall => "ALLTOALL",
            RequestKind::Barrier => "BARRIER",
            RequestKind::Join => "JOIN",
        }
    }
}

impl fmt::Display for RequestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
