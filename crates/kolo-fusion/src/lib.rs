//! kolo-fusion: Horovod's tensor fusion, written once for every kolo
//! backend and every memory.
//!
//! Small tensors are slow to reduce one by one, so kolo runs compatible
//! ready tensors as one collective. The crate has two halves:
//!
//! - **The plan is pure.** [`plan`] / [`plan_groups`] decide which
//!   responses fuse: plain functions over responses that every rank
//!   evaluates identically, with no memory, backend or clock in sight.
//! - **The execution is generic over the memory.** [`fused_allreduce`],
//!   [`fused_allgather`] and [`fused_reduce_scatter`] run a fused response
//!   on any backend `C: Collectives<M>` of any memory `M:
//!   Memory` ([`kolo_transport::Memory`]; [`Host`](kolo_transport::Host)
//!   unless said otherwise): tensors come in as `M`'s views, copies go
//!   through the backend ([`pack_into`] / [`unpack_from`], which check the
//!   layout first), one collective runs on the fused view, and every
//!   [`Phase`] is reported to the engine's timeline. [`FusionBuffers`]
//!   keeps one persistent buffer per (device, dtype), allocated by the
//!   backend, all of them within one byte budget.
//!
//! On the host the copies are kolo-transport's (in parallel on the rayon
//! pool when large), and where the backend reduces scattered segments in
//! place ([`Collectives::reduces_segments_in_place`](kolo_transport::Collectives::reduces_segments_in_place),
//! the shared-memory backend) a fused allreduce is one collective straight
//! over the tensors' own memory, with no fusion buffer and no copies.
//!
//! # Plugging in a device memory
//!
//! A device joins by implementing two traits of kolo-transport, nothing of
//! this crate:
//!
//! - [`Memory`](kolo_transport::Memory) for its memory: the views (`Ref`,
//!   `Mut`, `Owned`), their lengths, splitting and reborrowing. Fusion
//!   splits views (per tensor, per rank) and never reads through them. An
//!   `Owned` buffer must be safe to drop while work queued on it is still
//!   running (a stream-ordered free): a fusion buffer that grows is
//!   dropped and allocated anew between two operations.
//! - [`Collectives<ItsMemory>`](kolo_transport::Collectives) for its
//!   backend, with `new_buffer` (the fusion buffers and allgather's
//!   outputs), `pack_into` and `unpack_from` (the copies, ideally one
//!   batched launch each), and the collectives it serves: `allreduce`,
//!   `allgatherv`, `reduce_scatter`, optionally `allreduce_segments` with
//!   `reduces_segments_in_place` to skip the copies. A device memory's
//!   defaults fail as unsupported, so a missing one is an error, not a
//!   silent host fallback.
//!
//! The fused operations may return once the device has the work queued, in
//! the backend's order; the caller calls
//! [`Collectives::synchronize`](kolo_transport::Collectives::synchronize)
//! before it reads the results on the host. Buffers of such a memory start
//! from `FusionBuffers::<ItsMemory>::default()`.
//!
//! # Examples
//!
//! Planning: two allreduces that fit the threshold become one.
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
//!
//! Executing: two ranks of the threads backend allreduce two tensors as
//! one collective. The same call runs on a device memory's backend, with
//! that memory's views and buffers.
//!
//! ```
//! use kolo_fusion::{fused_allreduce, FusionBuffers, FusionError, Phase};
//! use kolo_protocol::{Device, ReduceOp};
//! use kolo_transport::{Generic, Scale, Topology};
//!
//! let results = kolo_threads::run(2, |comm| {
//!     let rank = comm.rank() as f32;
//!     let (mut w, mut b) = (vec![1.0, 2.0 + rank], vec![10.0 * rank]);
//!     let mut bufs = FusionBuffers::new();
//!     let mut phases = Vec::new();
//!     // `Generic` hides the threads backend's in-place segments: the
//!     // tensors go through the fusion buffer.
//!     fused_allreduce(
//!         &mut Generic(comm),
//!         &mut bufs,
//!         Device::Cpu,
//!         &mut [&mut w[..], &mut b[..]],
//!         ReduceOp::Sum,
//!         Scale::NONE,
//!         &mut |phase: Phase, _| phases.push(phase.name()),
//!     )?;
//!     Ok::<_, FusionError>((w, b, phases.len(), bufs.bytes_allocated()))
//! })
//! .unwrap();
//! for (w, b, phases, bytes) in results {
//!     assert_eq!((w, b), (vec![2.0, 5.0], vec![10.0]));
//!     // Copy in, collective, copy out: a start and an end each.
//!     assert_eq!(phases, 6);
//!     // One f32 fusion buffer of 3 elements.
//!     assert_eq!(bytes, 12);
//! }
//! ```

mod buffers;
mod error;
mod execute;
mod fusion_plan;
mod pack;
mod retention;
#[cfg(test)]
mod testing;

pub use buffers::{FusionBuffers, DEFAULT_BUFFER_BUDGET};
pub use error::FusionError;
pub use execute::{
    compressed_allreduce, fused_allgather, fused_allreduce, fused_reduce_scatter, Edge, Phase,
};
pub use fusion_plan::{fuse, fused_bytes, plan, plan_groups, FusionPlan};
pub use pack::{pack, pack_into, unpack, unpack_from, PARALLEL_COPY_BYTES};
