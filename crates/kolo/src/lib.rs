//! kolo: the communication of distributed deep-learning training, with
//! Horovod's engine.
//!
//! Each rank gets a [`Kolo`]: a background thread that owns the backend,
//! negotiates every named tensor with the other ranks (the coordinator
//! checks that all ranks asked for the same thing — a mismatch fails that
//! tensor on every rank instead of hanging), fuses ready allreduces into one
//! buffer, and performs the agreed operations in the same order everywhere.
//! Operations are submitted from any thread, blocking on [`Kolo`] or as
//! [`Handle`]s (`wait`, `poll`, `.await`) inside a [`Kolo::scope`];
//! allreduces work on the caller's buffers in place, and a
//! [`TensorGroup`] submits a model's gradients step after step as one
//! fused collective. A response cache skips negotiation for
//! tensors seen before, a stall inspector names ranks that never submit,
//! and rank 0 can write a Chrome-trace timeline. [`threads::run`] runs n
//! ranks as threads of one process; other backends start a [`Kolo`] with
//! [`Kolo::start`]. Settings come from [`Config`] (builder or `KOLO_*`
//! variables).
//!
//! ```
//! let results = kolo::threads::run(2, kolo::Config::default(), |kolo| {
//!     // Every rank contributes [rank + 1; 4]; the sum is 1 + 2 = 3.
//!     let mut grad = vec![(kolo.rank() + 1) as f32; 4];
//!     kolo.allreduce("grad", &mut grad, kolo::ReduceOp::Sum)?;
//!
//!     // Async, inside a scope: the engine reduces `bias` in place while
//!     // the scope's body goes on; the scope ends once it is done.
//!     let mut bias = vec![kolo.rank() as i64; 2];
//!     kolo.scope(|s| {
//!         let handle = s.allreduce_async("bias", &mut bias, kolo::ReduceOp::Max)?;
//!         handle.wait()
//!     })?;
//!     Ok((grad, bias))
//! })?;
//! for (grad, bias) in results {
//!     assert_eq!(grad, [3.0; 4]);
//!     assert_eq!(bias, [1, 1]);
//! }
//! # Ok::<(), kolo::Error>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod config;
#[cfg(feature = "nccl")]
mod device_tensor;
mod engine;
mod error;
mod group;
mod handle;
mod init;
mod kolo;
mod logging;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
mod ops;
mod panic_text;
mod placed;
mod process_set;
pub mod raw;
mod scope;
mod set_label;
mod split;
mod stats;
#[cfg(feature = "ucx")]
mod store_bulletin;
mod tensor;
pub mod threads;
#[cfg(feature = "ucx")]
mod ucx;

pub use config::{BackendKind, Config, LogLevel};
pub use engine::autotune::{Autotune, AutotunePhase, Candidate, CandidateScore};
pub use error::Error;
pub use group::TensorGroup;
/// The `half` crate whose `f16` and `bf16` kolo reduces, re-exported so
/// that a caller's tensors are of the same types whatever `half` it uses.
pub use half;
pub use handle::Handle;
pub use kolo::Kolo;
pub use kolo_protocol::{Compression, DataType, ReduceOp};
pub use kolo_transport::Element;
pub use logging::init_logging;
pub use ops::ReduceOptions;
pub use placed::{IntoTensor, IntoTensorMut, Received};
pub use process_set::ProcessSet;
pub use scope::Scope;
pub use split::split_rows;
pub use stats::Stats;
pub use tensor::{Tensor, TensorMut};

#[cfg(test)]
mod assert_traits {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn kolo_is_shareable_and_handles_movable() {
        send_sync::<crate::Kolo>();
        send::<crate::Handle<'static, Vec<f32>>>();
        send::<crate::Handle<'_, ()>>();
    }
}
