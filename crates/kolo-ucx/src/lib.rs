//! kolo-ucx: kolo's UCX backend. Processes of a job (started by
//! `kolo-run`, torchrun or any launcher that sets torchrun's variables)
//! meet through kolo-rendezvous, exchange their UCX worker addresses and
//! connect an endpoint to every peer; [`UcxComm`] then carries the data
//! plane as UCX tagged messages (shared memory, TCP or RDMA, whatever
//! `UCX_TLS` allows) with every collective from kolo-transport's generic
//! algorithms, and the control plane as probed variable-size messages.
//! `KOLO_HIERARCHICAL_ALLREDUCE=1` on every rank makes the allreduce of a
//! job of several hosts hierarchical (Horovod's): reduce-scatter in each
//! host, allreduce across hosts, allgather in each host. Over TCP alone
//! (`UCX_TLS=tcp,self`) a world communicator's large allreduces go over
//! two rails (two workers, the second driven by a thread of its own for
//! the communicator's life), `KOLO_UCX_RAILS` says otherwise.
//! A peer that dies is an error naming it (UCX's peer error handling), not
//! a hang.
//!
//! The bindings are kolo's own and small, layered as cudarc's are:
//! [`sys`] (declarations generated from the installed headers), [`result`]
//! (one thin function per call, statuses as errors) and [`safe`] (owning
//! types and waits). UCX 1.10 or newer is needed to build.
//!
//! ```
//! use kolo_rendezvous::{LaunchVars, Rendezvous};
//! use kolo_transport::{Collectives, Scale};
//! use kolo_ucx::UcxComm;
//!
//! // A job of one process: it meets itself at a store on loopback.
//! let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//! let vars = LaunchVars {
//!     master_addr: "127.0.0.1".into(),
//!     master_port: port,
//!     rank: 0,
//!     world_size: 1,
//!     local_rank: 0,
//!     local_world_size: 1,
//!     token: None,
//!     timeout: std::time::Duration::from_secs(20),
//! };
//! let mut rendezvous = Rendezvous::join(vars)?;
//! let mut comm = UcxComm::connect(&mut rendezvous)?;
//! rendezvous.close()?;
//! let mut grad = vec![1.5f32; 8];
//! comm.allreduce(&mut grad[..], kolo_protocol::ReduceOp::Sum, Scale::NONE)?;
//! assert_eq!(grad, vec![1.5; 8]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod bitwise;
mod comm;
mod control;
mod hierarchical;
mod lanes;
mod rails;
pub mod result;
pub mod safe;
pub mod sys;
pub mod tags;
mod tuning;

pub use comm::{UcxComm, UcxError};
pub use safe::wait::Interrupter;
