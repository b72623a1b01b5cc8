//! kolo-pipeline: stage-to-stage communication for pipeline-parallel
//! training (PipeDream's communication handler), over any kolo backend's
//! tagged send / recv.
//!
//! Every rank builds the same [`PipelineSpec`] — stages as lists of ranks,
//! tensors with the stage that produces and the stage that consumes them —
//! and gets its [`StagePlan`]: its stage, its replica index, and for each
//! tensor the ranks it receives from and sends to. Minibatches are dealt
//! round-robin over each stage's replicas ([`schedule`]), so sender and
//! receiver agree on the peer of every message without talking, for any
//! widths and any iteration count. A [`Pipeline`] then moves named
//! [`Tensor`]s — `send(name, tensor, minibatch, direction)` and
//! `recv(name, minibatch, direction)` — activations forward and gradients
//! backward, each message's dtype and shape travelling ahead of its data;
//! in forward-only mode the receiver acks every message and a sender keeps
//! at most `window` unacknowledged.
//!
//! ```
//! use kolo_pipeline::{pair_channels, Direction, Options, Pipeline, PipelineError,
//!     PipelineSpec, StagePlan, Tensor, TensorSpec};
//! use kolo_protocol::DataType;
//! use kolo_threads::Topology;
//! use std::sync::Mutex;
//!
//! // Two stages of one rank each; "act" goes forward, its gradient back.
//! let spec = PipelineSpec::with_widths(&[1, 1])
//!     .tensor(TensorSpec::new("act", DataType::F32, 1).from_stage(0).to_stage(1));
//! let options = Options::training(4);
//!
//! // A two-rank kolo-threads communicator for each one-way channel.
//! let sets = pair_channels(&spec, &options, |_| {
//!     let mut comms = kolo_threads::communicators(2).map_err(|e| PipelineError::Start(e.to_string()))?;
//!     let receiver = comms.pop();
//!     comms.pop().zip(receiver).ok_or_else(|| PipelineError::Start("no communicators".into()))
//! })?;
//! let sets: Vec<_> = sets.into_iter().map(|s| Mutex::new(Some(s))).collect();
//!
//! let sums = kolo_threads::run(2, |comm| -> Result<f32, Box<dyn std::error::Error>> {
//!     let rank = comm.rank();
//!     let channels = sets[rank].lock().map_err(|_| "poisoned")?.take().ok_or("taken")?;
//!     let pipe = Pipeline::start(StagePlan::new(&spec, rank)?, options, channels)?;
//!     let mut sum = 0.0;
//!     for g in 0..4 {
//!         if rank == 0 {
//!             pipe.send("act", Tensor::new([2], vec![g as f32, 1.0])?, g, Direction::Forward)?;
//!             sum += pipe.recv("act", g, Direction::Backward)?.as_slice::<f32>()?[0];
//!         } else {
//!             let x = pipe.recv("act", g, Direction::Forward)?;
//!             let grad: Vec<f32> = x.as_slice::<f32>()?.iter().map(|v| 2.0 * v).collect();
//!             pipe.send("act", Tensor::new(x.shape(), grad)?, g, Direction::Backward)?;
//!         }
//!     }
//!     pipe.finish()?;
//!     Ok(sum)
//! })?;
//! assert_eq!(sums[0], 12.0); // 2 * (0 + 1 + 2 + 3)
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How messages move
//!
//! Two engines move the messages. [`Pipeline::start`] runs PipeDream's
//! helper threads: one per (tensor, peer, direction) link, each owning a
//! communicator for its one-way channel from a [`ChannelFactory`] (with
//! kolo-threads, [`pair_channels`]; with MPI, [`duplicate_channels`] over
//! `MpiComm::duplicate`; with the `nccl` feature, `nccl::nccl_channels`,
//! and with `nccl` and `mpi`, `nccl::nccl_mpi_channels`),
//! so a receive blocked on one peer never holds up a send to another.
//! [`run_serial`] serves a single communicator (MPI initialised
//! `FUNNELED`) from one loop, posting receives in the order the stage asks
//! for them and the queued sends just before them.
//!
//! With the `nccl` feature, `nccl::nccl_channels` makes every channel a
//! two-rank NCCL communicator (ranks as threads of one process; with the
//! `mpi` feature too, `nccl::nccl_mpi_channels` does the same for ranks
//! as processes under `mpirun`, one GPU each), and `DeviceTensor`s (cudarc `CudaSlice`s
//! and their shapes) move GPU to GPU on them with
//! `Pipeline::send_device` / `Pipeline::recv_device`: the header as host
//! bytes, the elements by `ncclSend` / `ncclRecv` on the device buffers.
//! Channels are [`Channel`]s — host bytes for any kolo `Collectives`,
//! device tensors where the backend moves them; elsewhere a device tensor
//! is refused naming the tensor and the channel's ranks
//! ([`Pipeline::check_device`] asks without a GPU).
//!
//! A peer that fails, leaves or gives up makes its neighbours' calls fail
//! with [`PipelineError::PeerFailed`] naming its rank and stage (and, when
//! it aborted, its reason), never hang.
//!
//! # Features
//!
//! - `nccl`: the `nccl` module (`nccl_channels`), `DeviceTensor`, and the
//!   device-tensor calls of [`Channel`] and [`Pipeline`]. Needs no CUDA at
//!   build time: kolo-nccl loads CUDA and NCCL when it runs.
//! - `mpi`, with `nccl`: `nccl::nccl_mpi_channels`, NCCL channels for
//!   ranks as MPI processes. Needs an MPI library at build time.
//!
//! The documentation on docs.rs is built with both and marks each item
//! with the features it needs.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod channel;
mod channels;
#[cfg(feature = "nccl")]
mod device_tensor;
mod error;
mod link;
mod link_state;
#[cfg(feature = "nccl")]
pub mod nccl;
mod options;
mod payload;
mod pipeline;
mod pipeline_device;
mod plan;
pub mod schedule;
mod serial;
mod spec;
mod tensor;
mod threaded;
mod wire;

pub use channel::Channel;
pub use channels::{
    duplicate_channels, pair_channels, ChannelFactory, ChannelKey, ChannelKind, ChannelSet,
    Endpoint,
};
#[cfg(feature = "nccl")]
pub use device_tensor::DeviceTensor;
pub use error::{PipelineError, PlanError, TensorError};
pub use link_state::Helpers;
pub use options::{Direction, Mode, Options};
pub use pipeline::Pipeline;
pub use plan::{channels, StagePlan, TensorRoute};
pub use serial::run_serial;
pub use spec::{PipelineSpec, TensorSpec};
pub use tensor::{Tensor, MAX_DIMS};
