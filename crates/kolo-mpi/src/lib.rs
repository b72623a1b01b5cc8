//! kolo-mpi: kolo's MPI backend. One [`MpiComm`] per process is that rank's
//! control plane and host data plane across the processes of an MPI job.
//!
//! ```
//! use kolo_mpi::MpiComm;
//! use kolo_protocol::ReduceOp;
//! use kolo_transport::{Collectives, Scale, Topology};
//!
//! let mut comm = MpiComm::init(false)?;
//! let mut grad = vec![comm.rank() as f32; 1024];
//! comm.allreduce(&mut grad, ReduceOp::Sum, Scale::NONE)?;
//! let n = comm.size() as f32;
//! assert!(grad.iter().all(|&g| g == n * (n - 1.0) / 2.0));
//! # Ok::<(), kolo_transport::TransportError>(())
//! ```
//!
//! Under `mpirun -np 4 your-program` every process is one rank of four.
//! Started on its own, as this example is by `cargo test`, the process is
//! an MPI singleton: a job of one rank.
//!
//! [`MpiComm`] implements kolo's control plane ([`kolo_transport::Controller`]:
//! gather / broadcast / allgather of byte messages, barrier, bitwise
//! allreduce) on a private duplicate of `MPI_COMM_WORLD`, and the host data
//! plane ([`kolo_transport::Collectives`]) with MPI's own collectives on a
//! second duplicate. f16 and bf16 travel as kolo-defined 2-byte MPI
//! datatypes reduced by kolo's kernels (f32 accumulation); `Average` is a sum
//! followed by a scale. Local rank and size come from a shared-memory split.
//!
//! MPI is initialised once per process by [`MpiComm::init`], requesting
//! `MPI_THREAD_MULTIPLE` (or `MPI_THREAD_FUNNELED` when asked to, as kolo's
//! `KOLO_MPI_THREADS_DISABLE=1` does); [`MpiComm::thread_level`] reports
//! what MPI granted. [`MpiComm::duplicate`] makes a communicator of the
//! same ranks for another thread (collective; needs `MPI_THREAD_MULTIPLE`,
//! else [`MpiError::ThreadLevel`]); [`MpiComm::split`] makes communicators
//! of subsets of the ranks (kolo-pipeline's two-rank NCCL channels under
//! `mpirun` bootstrap over them). [`launcher`] starts a program under
//! `mpirun` from itself, which is how kolo's MPI tests run from
//! `cargo test`.
//!
//! kolo-mpi has no cargo features: every item is there whenever the crate
//! is. It needs an MPI library with `mpicc` (OpenMPI or MPICH) at build
//! time; kolo's `mpi` feature is what brings it in.
//!
//! # Failures
//! Communicators return MPI errors to kolo (`MPI_ERRORS_RETURN`) as
//! [`kolo_transport::TransportError::Backend`], naming the MPI call. A
//! process that dies while its peers wait is noticed by `mpirun`, which
//! ends the whole job (OpenMPI's default); kolo's engine adds its own stall
//! shutdown and a watchdog so a living but silent peer turns into errors
//! naming the rank and tensor.

#![deny(unsafe_op_in_unsafe_fn)]

mod collectives;
mod comm;
mod communicator;
mod controller;
mod datatype;
mod error;
pub mod launcher;
mod raw;
mod runtime;

pub use comm::{MpiComm, MAX_GROUP_TAG};
pub use error::MpiError;
pub use runtime::{granted_thread_level, ThreadLevel};
