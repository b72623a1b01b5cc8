//! kolo-nccl: kolo's NCCL backend — collectives, point-to-point and
//! transactions on CUDA memory, one [`NcclComm`] per GPU, in one process
//! per GPU or one thread per GPU.
//!
//! # Example
//!
//! Probing and planning need no GPU:
//!
//! ```
//! use kolo_nccl::{probe, reduce_plan, NcclError};
//! use kolo_protocol::{DataType, ReduceOp};
//! use kolo_transport::Scale;
//!
//! // Without a driver this is an error saying why, never a panic.
//! match probe::platform() {
//!     Ok(p) => println!("{} GPUs, NCCL {}", p.devices, probe::version_string(p.nccl_version)),
//!     Err(e) => println!("no NCCL here: {e}"),
//! }
//!
//! // A scaled average of f32 over 4 ranks is one PreMulSum by 2 * 0.5 / 4.
//! let plan = reduce_plan::plan_reduce(DataType::F32, ReduceOp::Average, Scale { prescale: 2.0, postscale: 0.5 }, 4)?;
//! assert_eq!(plan.kind, reduce_plan::ReduceKind::PreMulSum(0.25));
//! // An integer average sums in NCCL, then the scale kernel divides.
//! let plan = reduce_plan::plan_reduce(DataType::I32, ReduceOp::Average, Scale::NONE, 4)?;
//! assert_eq!(plan.postscale, Some(0.25));
//! // NCCL has no 16-bit integers.
//! assert!(reduce_plan::plan_reduce(DataType::I16, ReduceOp::Sum, Scale::NONE, 4).is_err());
//! # Ok::<(), NcclError>(())
//! ```
//!
//! On a machine with two GPUs, one thread per GPU, each rank's control
//! plane a kolo-threads communicator:
//!
//! ```no_run
//! use kolo_nccl::{NcclError, NcclOptions};
//! use kolo_protocol::ReduceOp;
//! use kolo_transport::{Scale, Topology};
//!
//! let ctrls = kolo_threads::communicators(2).expect("two ranks");
//! let sums = kolo_nccl::threads::run(ctrls, NcclOptions::default(), |comm, _ctrl| {
//!     let stream = comm.stream().clone();
//!     let host = [comm.rank() as f32 + 1.0; 4];
//!     let mut grad = stream.clone_htod(&host).map_err(NcclError::on_cuda("cuMemcpyHtoDAsync"))?;
//!     comm.all_reduce(&mut grad, ReduceOp::Sum, Scale::NONE)?.wait()?;
//!     stream.clone_dtoh(&grad).map_err(NcclError::on_cuda("cuMemcpyDtoHAsync"))
//! })
//! .expect("two GPUs");
//! assert_eq!(sums, vec![vec![3.0f32; 4]; 2]);
//! ```
//!
//! # How it works
//!
//! A communicator is bootstrapped over any kolo
//! [`Controller`](kolo_transport::Controller) (MPI's under `mpirun`,
//! kolo-threads' for the threads of one process, see [`threads::run`]),
//! which carries NCCL's unique id. In thread mode all-gathers and
//! transaction sends / receives may run on the copy engines
//! ([`CopyEngine::On`]). The mode is detected (one process alone is
//! process mode) or given ([`NcclOptions::mode`]).
//!
//! CUDA comes from cudarc's driver API and NCCL from `libnccl.so.2` (or the
//! path in `KOLO_NCCL_LIBRARY`), both loaded at run time: the crate builds
//! and links without CUDA, and a missing driver, library or symbol is an
//! [`NcclError`] (probed first, see [`probe`]), never a panic. Each
//! communicator owns a non-blocking stream at its device's highest
//! priority; every operation waits on the GPU for its buffers' last writes
//! (cudarc's per-buffer events; none for [`Untracked`] buffers, which the
//! caller orders itself, e.g. many at once with one ready event) and for
//! any ready event or stream given ([`NcclComm::wait_event`],
//! [`NcclComm::begin_after_event`]), and returns a [`Work`] completed by
//! the device's single completion thread (which spins briefly before it
//! sleeps, so back-to-back operations do not pay for waking it). That
//! thread also polls NCCL's asynchronous errors and fails pending work
//! when a peer dies or an operation outlives [`NcclOptions::op_timeout`],
//! then aborts the communicator (`ncclCommAbort`) at once, so that NCCL's
//! kernels waiting for a lost peer end; later calls fail saying so.
//! Dropping a communicator finalizes it when healthy and aborts it
//! otherwise, within [`NcclOptions::teardown_timeout`]; in thread mode the
//! ranks finalize together and none returns before all are done.
//!
//! [`HostStaging`] serves kolo's host data plane
//! ([`Collectives`](kolo_transport::Collectives)) through NCCL so the one
//! conformance suite runs on it.
//!
//! # kolo's data plane on device memory
//!
//! [`Cuda`] is device memory as a kolo [`Memory`](kolo_transport::Memory):
//! `NcclComm` implements `Collectives<Cuda>` over [`CudaRef`] /
//! [`CudaMut`] views of cudarc buffers (or [`CudaBuffer`]s it allocates),
//! through the same operations as its inherent API, and [`CudaBackend`]
//! pairs it with its control plane. Code written once over memories —
//! kolo-fusion, the conformance suite (the `gpu_conformance` test binary)
//! — runs on GPU buffers. Unlike host memory the calls are stream-ordered:
//! they enqueue and return, and results are visible after `synchronize`.
//!
//! ```no_run
//! use kolo_nccl::{Cuda, NcclError, NcclOptions};
//! use kolo_protocol::ReduceOp;
//! use kolo_transport::{Collectives, Memory, Scale};
//!
//! /// An allreduce written once, for any memory.
//! fn sum_on<M: Memory, C: Collectives<M>>(comm: &mut C, data: &[f32]) -> kolo_transport::Result<Vec<f32>> {
//!     let mut buf = comm.buffer_from(data)?;
//!     comm.allreduce(M::view_mut(&mut buf), ReduceOp::Sum, Scale::NONE)?;
//!     comm.synchronize()?;
//!     comm.read_buffer(M::view(&buf))
//! }
//!
//! let ctrls = kolo_threads::communicators(2).expect("two ranks");
//! let sums = kolo_nccl::threads::run(ctrls, NcclOptions::default(), |comm, _ctrl| {
//!     sum_on::<Cuda, _>(comm, &[1.0, 2.0]).map_err(NcclError::from)
//! })
//! .expect("two GPUs");
//! assert_eq!(sums, vec![vec![2.0f32, 4.0]; 2]);
//! ```
//!
//! # Reductions on the device
//!
//! Sum, min, max and product are native for f32, f64, f16, bf16, i32, i64,
//! u8, i8 (bool as u8: OR / AND). Float averages use `ncclAvg`; float pre-
//! and post-scales of sums and averages fold into one
//! `ncclRedOpCreatePreMulSum` factor. Everything else that scales —
//! integer averages and scales, scaled min / max / product, any scale on
//! one rank — runs kolo-nccl's own scale kernel before and / or after the
//! NCCL call, with kolo's element semantics. The kernel is PTX written by
//! hand, JIT-compiled by the driver on first use: no nvrtc or nvcc. Only
//! u16 / i16 reductions are [`NcclError::Unsupported`] (NCCL has no such
//! type); [`HostStaging`] covers them. See [`reduce_plan`].
//!
//! # The peer allreduce
//!
//! With 2 to 8 ranks, every communicator registers a buffer per rank that
//! the other GPUs read directly (peer access in thread mode, CUDA IPC in
//! process mode), and in-place allreduces of f32, f16 and bf16 (sum,
//! average) up to a few MiB run kolo-nccl's one-shot or two-shot kernel
//! instead of NCCL, where NCCL's ring is latency-bound; [`crossover`]
//! chooses, and `KOLO_NVLINK_ALLREDUCE=0` turns the kernels off. Every
//! rank gets the same bits (the sum in rank order).
//!
//! The [`DeviceFusionBuffer`] packs and unpacks many tensors with one
//! launch of a second hand-written kernel, a batched copy over a table of
//! (source, destination, bytes) rows read from mapped pinned memory.
//!
//! # CUDA version
//!
//! cudarc is built with `cuda-12080`: the 12.8 driver API, which drivers of
//! CUDA 12.8 and every later version (13.x included) serve. Every driver
//! symbol used is listed in [`probe::DRIVER_SYMBOLS`] and checked before
//! first use.
//!
//! # Features
//!
//! None: everything is always built, and nothing links CUDA or NCCL at
//! build time.
//!
//! # Layout
//!
//! As cudarc: `sys` (NCCL's types and function table), `result` (one
//! function per C call, status codes become [`NcclError`]), `safe` (owning
//! types; the communicator handle never leaves it) and `kernels` (the PTX
//! kernels and their loader), with the pure planning beside them
//! ([`reduce_plan`], offsets and exchanges, the bootstrap's messages),
//! tested without a GPU. The GPU checks are the `gpu_threads`, `gpu_mpi`
//! and `gpu_conformance` test binaries, the timings the `nccl_bench`
//! benchmark.

#![cfg_attr(docsrs, feature(doc_cfg))]

/// `Topology` from the `comm` field (an [`NcclComm`]) and `Controller`
/// from the `ctrl` field of a `$t<'_, C: Controller>`: the wrappers that
/// pair a communicator with the control plane it was built over.
macro_rules! comm_and_control {
    ($t:ident) => {
        impl<C: kolo_transport::Controller + ?Sized> kolo_transport::Topology for $t<'_, C> {
            fn rank(&self) -> usize {
                self.comm.rank()
            }
            fn size(&self) -> usize {
                self.comm.size()
            }
            fn local_rank(&self) -> usize {
                self.comm.local_rank()
            }
            fn local_size(&self) -> usize {
                self.comm.local_size()
            }
        }

        impl<C: kolo_transport::Controller + ?Sized> kolo_transport::Controller for $t<'_, C> {
            fn gather_bytes(
                &mut self,
                msg: &[u8],
                root: usize,
            ) -> kolo_transport::Result<Option<Vec<Vec<u8>>>> {
                self.ctrl.gather_bytes(msg, root)
            }
            fn broadcast_bytes(
                &mut self,
                msg: &[u8],
                root: usize,
            ) -> kolo_transport::Result<Vec<u8>> {
                self.ctrl.broadcast_bytes(msg, root)
            }
            fn allgather_bytes(&mut self, msg: &[u8]) -> kolo_transport::Result<Vec<Vec<u8>>> {
                self.ctrl.allgather_bytes(msg)
            }
            fn control_barrier(&mut self) -> kolo_transport::Result<()> {
                self.ctrl.control_barrier()
            }
            fn bitwise_allreduce(
                &mut self,
                words: &mut [u64],
                op: kolo_transport::BitOp,
            ) -> kolo_transport::Result<()> {
                self.ctrl.bitwise_allreduce(words, op)
            }
        }
    };
}
pub(crate) use comm_and_control;

mod board;
mod bootstrap;
mod copy_plan;
pub mod crossover;
mod cuda_backend;
mod error;
mod kernels;
mod options;
mod outbox;
mod plan;
pub mod probe;
pub mod reduce_plan;
mod result;
mod safe;
mod span;
mod sys;
pub mod threads;
mod widen;

pub use cuda_backend::CudaBackend;
pub use error::{NcclError, Result};
pub use options::{CopyEngine, Mode, NcclOptions};
pub use plan::destructive_slot;
pub use safe::comm::NcclComm;
pub use safe::device::Device;
pub use safe::event_pool::PoolStats;
pub use safe::fusion::DeviceFusionBuffer;
pub use safe::memory::{Cuda, CudaBuffer};
pub use safe::ops::DeviceElement;
pub use safe::persistent::PersistentAllreduce;
pub use safe::space::UntrackedSpace;
pub use safe::staging::{HostStaging, DEFAULT_CHUNK_BYTES};
pub use safe::teardown::Teardown;
pub use safe::transaction::DeviceTransaction;
pub use safe::untracked::Untracked;
pub use safe::views::{CudaMut, CudaRef};
pub use safe::work::Work;

#[doc(hidden)]
pub use safe::baseline::Bare;
#[doc(hidden)]
pub use safe::peer_group::PeerGroup;
#[doc(hidden)]
pub use safe::peer_local::LocalPeerRanks;
