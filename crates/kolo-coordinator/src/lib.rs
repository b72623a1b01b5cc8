//! kolo-coordinator: the negotiation that makes every rank perform the same
//! collectives in the same order (Horovod's control plane).
//!
//! Every rank calls [`Coordinator::cycle`] once per cycle with the requests
//! enqueued since the last one. Requests seen before settle on the fast path:
//! the [`response_cache`] maps each to a slot, and one bitwise allreduce of a
//! small [`bit_vector`] agrees on the slots every rank has (and carries the
//! shutdown, join and invalidation flags), so no request list travels. New or
//! changed requests go to rank 0, whose [`message_table`] counts them; a
//! tensor is ready when every rank that has not [`join`]ed submitted it, and
//! rank 0 validates ready tensors (with `kolo_protocol::validate`) in the
//! order they became ready and broadcasts the responses. The cycle output is
//! the same response sequence on every rank. The [`stall`] inspector names
//! the ranks that never submitted a tensor, warns, and can fail the tensor
//! and shut down. The decisions are pure functions over data
//! ([`negotiate`], [`pending`], [`stall`], ...); [`Coordinator::cycle`] is
//! the thin shell that makes the [`Controller`](kolo_transport::Controller)
//! calls.
//!
//! # Example
//!
//! One rank negotiating with itself (a real job uses a backend's
//! controller): the first cycle goes through rank 0, the repeat hits the
//! cache.
//!
//! ```
//! use kolo_coordinator::{Coordinator, CoordinatorConfig};
//! use kolo_protocol::{DataType, Request, RequestKind};
//! use kolo_transport::{BitOp, Controller, Result, Topology};
//! use std::time::Instant;
//!
//! struct Alone;
//! impl Topology for Alone {
//!     fn rank(&self) -> usize { 0 }
//!     fn size(&self) -> usize { 1 }
//!     fn local_rank(&self) -> usize { 0 }
//!     fn local_size(&self) -> usize { 1 }
//! }
//! impl Controller for Alone {
//!     fn gather_bytes(&mut self, msg: &[u8], _: usize) -> Result<Option<Vec<Vec<u8>>>> {
//!         Ok(Some(vec![msg.to_vec()]))
//!     }
//!     fn broadcast_bytes(&mut self, msg: &[u8], _: usize) -> Result<Vec<u8>> { Ok(msg.to_vec()) }
//!     fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> { Ok(vec![msg.to_vec()]) }
//!     fn control_barrier(&mut self) -> Result<()> { Ok(()) }
//!     fn bitwise_allreduce(&mut self, _: &mut [u64], _: BitOp) -> Result<()> { Ok(()) }
//! }
//!
//! let mut coordinator = Coordinator::new(0, 1, CoordinatorConfig::default());
//! let grad = Request::new(0, "grad/w1", RequestKind::Allreduce, DataType::F32, vec![1024]);
//! for step in 0..2 {
//!     let out = coordinator.cycle_requests(&mut Alone, vec![grad.clone()], false, Instant::now())?;
//!     assert_eq!(out.responses.len(), 1);
//!     assert_eq!(out.responses[0].tensor_names, ["grad/w1"]);
//!     assert_eq!(out.stats.gathered, step == 0); // the second step is a cache hit
//! }
//! # Ok::<(), kolo_coordinator::CoordinatorError>(())
//! ```
//!
//! # Protocol notes
//!
//! - **Cache.** A hit needs the name and every parameter to equal this
//!   rank's request when the response was cached; a cached name requested
//!   with other parameters invalidates the slot on every rank (OR-ed invalid
//!   bits) and goes through rank 0. Only successful single-tensor responses
//!   decided while no rank is joined are cached, so results are identical
//!   with and without the cache. Cache hits follow rank 0's responses in
//!   slot order.
//! - **Join.** While any rank is joined, the cache path pauses: every pending
//!   request goes through rank 0, which must know who contributes data. A
//!   joined rank performs responses for tensors it lacks with the operation's
//!   identity; `Average` over the contributing ranks is sent as `Sum` with
//!   `postscale / contributors`; a broadcast from a joined root or an
//!   alltoall lacking a rank is an error response naming the ranks. When all
//!   ranks have joined, one `Op(Join)` response names the join requests and
//!   the round resets.
//! - **Shutdown.** Any rank's `shutdown` makes the output's `shutdown` true
//!   on every rank, with `shutdown_ranks` naming who asked.
//! - **Stalls.** See [`stall`]: warnings after `stall_warning`, error
//!   responses and shutdown after `stall_shutdown`; tensors stuck on the
//!   cache path are moved to rank 0's table after the shorter of the two.
//! - **Ids.** Tensors are named once ([`Coordinator::register`]) and
//!   requested by [`TensorId`]; a request without parameters repeats the
//!   id's last ones. Cache hits come out as [`Hit`]s (a slot and this
//!   rank's id) whose responses stay in the cache, read in place. A
//!   repeated group handed over as [`Intake::Group`] is taken in and
//!   settled as one unit while nothing else is pending (see [`pending`]).
//! - **Deferred books.** [`Coordinator::cycle_deferring`] ends a cycle of
//!   cache hits only at the agreement ([`Cycle::Hits`]): the caller can
//!   perform the agreed slots first and settle the cycle with
//!   [`Coordinator::finish_cycle`] after (before the next cycle), which
//!   returns what [`Coordinator::cycle`] would have.

#![warn(missing_docs)]

pub mod bit_vector;
mod config;
mod cycle;
mod error;
pub mod join;
mod lru;
pub mod message_table;
pub mod names;
pub mod negotiate;
mod output;
pub mod pending;
pub mod response_cache;
pub mod stall;

pub use config::CoordinatorConfig;
pub use cycle::{Agreement, Coordinator, Cycle};
pub use error::CoordinatorError;
pub use names::{NameError, Names, TensorId};
pub use output::{Agreed, CycleOutput, CycleStats, Hit, NegotiationEvent};
pub use pending::{Intake, Submission};
pub use stall::{stalled, StallReport};
