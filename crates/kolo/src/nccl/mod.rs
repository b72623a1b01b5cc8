//! The GPU engine (the `nccl` feature): device tensors — cudarc's
//! [`CudaSlice`](cudarc::driver::CudaSlice) and views — negotiated,
//! validated and fused like host tensors, and reduced by NCCL on the
//! device, with no copy to the host.
//!
//! [`run`] starts one engine per GPU as threads of this process: the
//! engine thread of rank r owns GPU r's [`NcclComm`](kolo_nccl::NcclComm),
//! bootstrapped over kolo-threads (the communicator is not shared between
//! threads: it is created and used on the engine thread). With the `mpi`
//! feature too, `Kolo::init_nccl_mpi` starts one process per GPU under
//! `mpirun`, and with `ucx`, `Kolo::init_nccl_ucx` one process per GPU
//! under `kolo-run` or torchrun's variables (NCCL bootstrapped through
//! kolo-rendezvous' store). Negotiation runs on the controller
//! (kolo-threads, MPI or UCX), and
//! so do host tensors on these engines: they keep using the controller's
//! host collectives, while device tensors go to NCCL.
//!
//! Device tensors go through the same calls as host tensors: blocking on
//! [`Kolo`](crate::Kolo) (`kolo.allreduce("grad", &mut cuda_slice, Sum)`)
//! or asynchronously inside a [`Kolo::scope`](crate::Kolo::scope), and
//! repeated steps as one [`TensorGroup`](crate::TensorGroup); the traits
//! [`IntoTensorMut`](crate::IntoTensorMut) and
//! [`IntoTensor`](crate::IntoTensor) list what the calls take. At
//! submission one event is recorded on each stream of the submitted
//! tensors; the engine's NCCL stream waits for it on the GPU (never a CPU
//! sync) and performs the agreed operation on the tensors' addresses —
//! ready allreduces of one dtype / op fused by kolo-fusion on device
//! memory (one batched pack into a persistent fusion buffer, one NCCL
//! allreduce, one batched unpack), with no cudarc event per tensor. The
//! handle completes when the GPU work has completed, so the result is
//! visible to every stream.
//!
//! ```no_run
//! use kolo::nccl::cudarc::driver::CudaSlice;
//! let sums = kolo::nccl::run(2, kolo::Config::default(), |kolo| {
//!     let gpu = kolo.gpu().expect("a GPU engine");
//!     let stream = kolo::nccl::cudarc::driver::CudaContext::new(gpu)
//!         .and_then(|ctx| Ok(ctx.default_stream()))
//!         .map_err(|e| kolo::Error::Start { message: format!("{e:?}") })?;
//!     let mut grad: CudaSlice<f32> = stream
//!         .clone_htod(&[kolo.rank() as f32 + 1.0; 4])
//!         .map_err(|e| kolo::Error::Start { message: format!("{e:?}") })?;
//!     kolo.allreduce("grad", &mut grad, kolo::ReduceOp::Sum)?;
//!     stream
//!         .clone_dtoh(&grad)
//!         .map_err(|e| kolo::Error::Start { message: format!("{e:?}") })
//! })?;
//! assert_eq!(sums, vec![vec![3.0f32; 4]; 2]);
//! # Ok::<(), kolo::Error>(())
//! ```

mod allreduce;
mod collectives;
#[cfg(feature = "mpi")]
mod mpi;
mod plane;
mod ready;
mod scope;
mod start;
mod tensor;
#[cfg(feature = "ucx")]
mod ucx;

pub use crate::device_tensor::{DeviceReceived, DeviceTensor, DeviceTensorMut};
pub use cudarc;
pub use kolo_nccl::{DeviceElement, NcclOptions};
pub use plane::{
    NCCL_ALLGATHER, NCCL_ALLREDUCE, NCCL_ALLTOALL, NCCL_BROADCAST, NCCL_REDUCESCATTER,
};
pub(crate) use start::start_one;
pub use start::{run, run_with};
