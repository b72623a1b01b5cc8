//! kolo-fusion: Horovod's tensor fusion, written once for every kolo
//! backend.
//!
//! Small tensors are slow to reduce one by one, so kolo runs compatible
//! ready tensors as one collective. [`plan`] decides which responses fuse (a
//! pure function every rank evaluates identically), [`FusionBuffers`] keeps
//! one persistent buffer per (device, dtype), [`pack`] / [`unpack`] copy
//! between tensors and that buffer (in parallel when large), and
//! [`fused_allreduce`], [`fused_allgather`] and [`fused_reduce_scatter`] run
//! a fused response on any [`Collectives`](kolo_transport::Collectives)
//! backend — copy in, one collective, copy out — reporting each [`Phase`] to
//! the engine's timeline. Where the backend reduces scattered segments in
//! place ([`Collectives::reduces_segments_in_place`](kolo_transport::Collectives::reduces_segments_in_place),
//! the shared-memory backend), a fused allreduce is one collective straight
//! over the tensors' own memory, with no fusion buffer and no copies.
//!
//! ```
//! use kolo_fusion::plan;
//! use kolo_protocol::{DataType, Device, RequestKind, Response, ResponseKind};
//!
//! let allreduce = |name: &str, elements: u64| Response {
//!     kind: ResponseKind::Op(RequestKind::Allreduce),
//!     dtype: DataType::F32,
//!     devices: vec![Device::Cpu, Device::Cpu],
//!     tensor_sizes: vec![elements],
//!     ..Response::error(name, "")
//! };
//! // 16 + 32 bytes fit in a 64-byte threshold: one fused allreduce.
//! let fused = plan(vec![allreduce("grad/w1", 4), allreduce("grad/b1", 8)], 64);
//! assert_eq!(fused.len(), 1);
//! assert_eq!(fused[0].tensor_names, ["grad/w1", "grad/b1"]);
//! assert_eq!(fused[0].tensor_sizes, [4, 8]);
//! ```

mod buffers;
mod error;
mod execute;
mod fusion_plan;
mod pack;
#[cfg(test)]
mod testing;

pub use buffers::FusionBuffers;
pub use error::FusionError;
pub use execute::{fused_allgather, fused_allreduce, fused_reduce_scatter, Edge, Phase};
pub use fusion_plan::{fuse, fused_bytes, plan, plan_groups, FusionPlan};
pub use pack::{pack, pack_into, unpack, unpack_from, PARALLEL_COPY_BYTES};
