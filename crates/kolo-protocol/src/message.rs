//! Requests (rank -> coordinator) and responses (coordinator -> every rank).

use crate::types::{Compression, DataType, Device, ReduceOp, RequestKind};
use serde::{Deserialize, Serialize};

/// One rank's wish to run a collective on one named tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The rank that sent the request.
    pub rank: u32,
    /// The tensor's name; unique among the names in flight on a rank.
    pub tensor_name: String,
    /// The collective asked for.
    pub kind: RequestKind,
    /// The tensor's element type.
    pub dtype: DataType,
    /// The tensor's shape on this rank (empty for a scalar).
    pub shape: Vec<u64>,
    /// Where the tensor lives on this rank.
    pub device: Device,
    /// Root rank for broadcast; 0 otherwise.
    pub root_rank: u32,
    /// Reduce op for allreduce and reduce-scatter; `Sum` otherwise.
    pub reduce_op: ReduceOp,
    /// Factor applied to the input before the reduction.
    pub prescale: f64,
    /// Factor applied to the output after the reduction.
    pub postscale: f64,
    /// Alltoall: how many first-dimension rows go to each rank (empty means
    /// even split).
    pub splits: Vec<u64>,
    /// Allreduce: how floating-point data travels.
    pub compression: Compression,
}

impl Request {
    /// A request with neutral defaults (root 0, sum, scale factors 1, CPU, no
    /// splits) to be adjusted with struct update syntax.
    pub fn new(
        rank: u32,
        tensor_name: impl Into<String>,
        kind: RequestKind,
        dtype: DataType,
        shape: Vec<u64>,
    ) -> Self {
        Request {
            rank,
            tensor_name: tensor_name.into(),
            kind,
            dtype,
            shape,
            device: Device::Cpu,
            root_rank: 0,
            reduce_op: ReduceOp::Sum,
            prescale: 1.0,
            postscale: 1.0,
            splits: Vec::new(),
            compression: Compression::None,
        }
    }

    /// Number of elements (product of the shape; 1 for a scalar), saturating
    /// at `u64::MAX` for a shape whose product overflows (a peer may send
    /// any shape; [`validate`](crate::validate()) rejects such a request).
    pub fn num_elements(&self) -> u64 {
        self.checked_num_elements().unwrap_or(u64::MAX)
    }

    /// Number of elements, or `None` when the product overflows `u64`.
    pub fn checked_num_elements(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }
}

/// Everything one rank sends to the coordinator in one cycle.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestList {
    /// The requests, in the order the rank submitted them.
    pub requests: Vec<Request>,
    /// The rank asks the job to shut down.
    pub shutdown: bool,
}

/// What a response tells the ranks to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResponseKind {
    /// Perform this collective.
    Op(RequestKind),
    /// Fail the named tensors' handles with `error_message`.
    Error,
}

/// The coordinator's decision for one tensor, or for several fused tensors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// What to do.
    pub kind: ResponseKind,
    /// One name, or several when fused (performed in this order).
    pub tensor_names: Vec<String>,
    /// Set when `kind` is `Error`; names the tensor, the values and the ranks.
    pub error_message: String,
    /// The element type of every named tensor.
    pub dtype: DataType,
    /// The device of each rank that sent a request, in rank order (ranks
    /// that joined and sent none are left out).
    pub devices: Vec<Device>,
    /// Allreduce and reduce-scatter: how to combine; `Sum` otherwise.
    pub reduce_op: ReduceOp,
    /// Broadcast: the rank whose tensor everyone receives; 0 otherwise.
    pub root_rank: u32,
    /// Allreduce and reduce-scatter: factor applied before the reduction.
    pub prescale: f64,
    /// Allreduce and reduce-scatter: factor applied after the reduction.
    pub postscale: f64,
    /// Allgather: first-dimension size of every rank's tensor in rank order,
    /// 0 for a rank that joined and sent no request (for fused allgathers,
    /// tensor after tensor: `tensor_names.len() x size`).
    pub first_dims: Vec<u64>,
    /// Alltoall: every rank's split sizes, rank after rank (`size x size`;
    /// an even split is written out, a rank that joined sends zeros).
    pub splits: Vec<u64>,
    /// Number of elements of each tensor (allreduce, broadcast,
    /// reduce-scatter), in the order of `tensor_names`; used for fusion.
    pub tensor_sizes: Vec<u64>,
    /// Allreduce: how floating-point data travels.
    pub compression: Compression,
}

impl Response {
    /// An error response for the given tensor.
    pub fn error(tensor_name: impl Into<String>, message: impl Into<String>) -> Self {
        Response {
            kind: ResponseKind::Error,
            tensor_names: vec![tensor_name.into()],
            error_message: message.into(),
            dtype: DataType::U8,
            devices: Vec::new(),
            reduce_op: ReduceOp::Sum,
            root_rank: 0,
            prescale: 1.0,
            postscale: 1.0,
            first_dims: Vec::new(),
            splits: Vec::new(),
            tensor_sizes: Vec::new(),
            compression: Compression::None,
        }
    }

    /// True for an error response.
    pub fn is_error(&self) -> bool {
        self.kind == ResponseKind::Error
    }
}

/// Everything the coordinator broadcasts in one cycle.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseList {
    /// The responses, performed by every rank in this order.
    pub responses: Vec<Response>,
    /// Every rank must shut down after performing `responses`.
    pub shutdown: bool,
}
