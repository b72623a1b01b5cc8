//! The safe layer: owning types whose `Drop` releases what they hold, and
//! the operations of [`NcclComm`](crate::NcclComm) on them.
//!
//! Only [`raw_comm`] holds NCCL's communicator handle; everything above it
//! calls its methods. Device addresses appear only between a buffer's
//! cudarc guard (which orders its stream and keeps it alive) and the
//! `unsafe` call that uses them, each with the `SAFETY:` argument of why
//! the memory spans what the call reads or writes.
//!
//! - the communicator: [`comm`] (init, health, close), [`raw_comm`],
//!   [`teardown`], [`completion`] (the device's completion thread) and
//!   [`work`] (the handles it completes);
//! - the device: [`device`] (context, stream, pooled events from
//!   [`event_pool`]) and [`copy_engine`] (thread-mode peer copies);
//! - the operations: [`ops`] (data movement), [`reduce_ops`], [`p2p`],
//!   [`transaction`] with [`tx_execute`], [`baseline`] (the bare NCCL call
//!   the benchmarks compare against);
//! - the peer allreduce: [`peer_buffers`] (every rank's registered
//!   buffer, through peer access or CUDA IPC), [`peer_group`] (the same
//!   without NCCL, for the GPU tests), [`peer_local`]
//!   (simulated ranks on one device, for the GPU tests), [`peer_ops`]
//!   (the allreduce through them);
//! - on top: [`fusion`] (the device fusion buffer), [`untracked`] (memory
//!   without cudarc's events), [`staging`] and [`staging_tx`] (kolo's host
//!   data plane through NCCL);
//! - kolo's data plane on device memory: [`memory`] (the `Cuda` memory and
//!   its buffers), [`views`] (its views and the cudarc buffers they
//!   borrow), [`access`] (how an operation reaches a view's memory),
//!   [`collectives`] (`Collectives<Cuda>`) with [`buffers`], [`device_p2p`]
//!   and [`device_tx`].

pub(crate) mod access;
pub(crate) mod baseline;
pub(crate) mod buffers;
pub(crate) mod collectives;
pub(crate) mod comm;
pub(crate) mod completion;
pub(crate) mod copy_engine;
pub(crate) mod device;
pub(crate) mod device_p2p;
pub(crate) mod device_tx;
pub(crate) mod event_pool;
pub(crate) mod fusion;
pub(crate) mod memory;
pub(crate) mod ops;
pub(crate) mod p2p;
pub(crate) mod peer_buffers;
pub(crate) mod peer_group;
pub(crate) mod peer_local;
pub(crate) mod peer_ops;
pub(crate) mod persistent;
pub(crate) mod raw_comm;
pub(crate) mod reduce_ops;
pub(crate) mod space;
pub(crate) mod staging;
pub(crate) mod staging_tx;
pub(crate) mod teardown;
pub(crate) mod transaction;
pub(crate) mod tx_execute;
pub(crate) mod untracked;
pub(crate) mod views;
pub(crate) mod work;
