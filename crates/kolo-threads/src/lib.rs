//! kolo-threads: kolo's embedded default backend — `n` ranks as threads of
//! one process, talking through shared memory.
//!
//! [`communicators`] builds the [`ThreadComm`]s of one communicator (hand
//! one to each thread); [`run`] spawns the threads for you, catches their
//! errors and panics, and makes every peer blocked on a failed rank fail
//! promptly with [`TransportError::PeerFailed`] naming it, never hang. A
//! `ThreadComm` implements both planes of `kolo-transport` — the control
//! plane ([`Controller`]) and the host data plane ([`Collectives`]) — with
//! shared-memory algorithms and no staging copies: the ranks publish their
//! buffers' addresses and read each other's in place (allreduce reduces
//! each rank's 1/n chunk straight from the peers' buffers;
//! `allreduce_segments` does the same over scattered segments, such as the
//! tensors of a fused response, where they lie), a send copies
//! straight into the peer's posted receive or else into a per-(source,
//! destination, tag) mailbox (large `sendrecv`s lend their buffer for the
//! receiver to copy once), and barriers spin briefly before they sleep. Arguments that do not fit together across
//! ranks (lengths, counts, roots, ops, element types, or two different
//! collectives) are an `InvalidArgument` on every rank.
//!
//! ```
//! use kolo_protocol::ReduceOp;
//! use kolo_transport::{Collectives, Scale, Topology, TransportError};
//!
//! let sums = kolo_threads::run(4, |comm| {
//!     let mut v = vec![comm.rank() as f32; 8];
//!     comm.allreduce(&mut v, ReduceOp::Sum, Scale::NONE)?;
//!     Ok::<_, TransportError>(v)
//! })?;
//! // 0 + 1 + 2 + 3 on every rank.
//! assert!(sums.iter().all(|v| v == &[6.0; 8]));
//!
//! // A failing rank makes its peers fail instead of hanging.
//! let err = kolo_threads::run(3, |comm| {
//!     if comm.rank() == 2 {
//!         return Err(TransportError::Backend("out of memory".into()));
//!     }
//!     comm.barrier()
//! })
//! .unwrap_err();
//! assert_eq!(err.failures[0].rank, 2);
//! assert!(err.to_string().starts_with("rank 2 failed: backend error: out of memory"));
//! # Ok::<(), kolo_threads::RunError>(())
//! ```

mod allreduce;
mod allreduce_segments;
mod backoff;
mod barrier;
mod call;
mod collectives;
mod comm;
mod control;
mod error;
mod exchange;
mod health;
mod mailbox;
mod message;
mod partition;
mod reduce;
mod run;
mod scratch;
mod shared;
mod validate;
mod world;

#[cfg(test)]
mod tests;

pub use comm::ThreadComm;
pub use error::{RankFailure, RunError, ThreadsError};
pub use run::run;

#[doc(no_inline)]
pub use kolo_transport::{Collectives, Controller, Topology, TransportError};

use std::num::NonZeroUsize;
use std::sync::Arc;
use world::World;

/// The `n` ranks of one new communicator, in rank order (rank `r` is
/// element `r`; `local_rank = rank`, `local_size = size`). Move each to
/// its own thread: every collective waits for all `n`.
pub fn communicators(n: usize) -> Result<Vec<ThreadComm>, ThreadsError> {
    if n == 0 {
        return Err(ThreadsError::NoRanks { requested: n });
    }
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let world = Arc::new(World::new(n, cores));
    Ok((0..n)
        .map(|rank| ThreadComm::new(Arc::clone(&world), rank))
        .collect())
}
