//! Generic collective algorithms written once against point-to-point
//! `send` / `recv` / `sendrecv` of [`Collectives`] and [`Topology`] (Gloo's
//! way): the defaults of every collective in the trait, so a backend that
//! only moves messages between pairs of ranks gets every collective.
//!
//! | collective                | algorithm                                         | steps          |
//! |---------------------------|---------------------------------------------------|----------------|
//! | allreduce, up to 32 KiB   | recursive doubling                                | `log2 n` (+2)  |
//! | allreduce, above          | ring reduce-scatter in 256 KiB segments, ring allgather | `2 (n - 1)` |
//! | reduce-scatter            | ring, one block per rank (uneven allowed)         | `n - 1`        |
//! | allgatherv                | ring, one block per rank (zeros allowed)          | `n - 1`        |
//! | broadcast                 | binomial tree from any root                       | `ceil(log2 n)` |
//! | alltoallv                 | pairwise exchange                                 | `n - 1`        |
//! | hierarchical allreduce    | ring in each host, across hosts, in each host     | `2 (k + h - 2)`|
//! | rail allreduce            | one part per rail (communicator), each on a thread | as allreduce  |
//! | threaded rail allreduce   | two parts: the caller's, a persistent rail thread's | as allreduce |
//! | barrier                   | dissemination                                     | `ceil(log2 n)` |
//!
//! Every algorithm checks its arguments first (count lists of length
//! `size`, buffer lengths, `root < size`) and returns
//! [`crate::TransportError::InvalidArgument`] naming the values; empty
//! buffers and a single rank are ordinary cases. Their messages use tags
//! from [`RESERVED_TAG_BASE`] up, which user code must not use.

mod blocks;
mod dissemination_barrier;
mod generic;
mod hierarchical;
mod pairwise_alltoallv;
mod rail_thread;
mod rails;
pub mod recursive_doubling;
mod ring_allgatherv;
mod ring_allreduce;
mod ring_reduce_scatter;
mod scratch;
mod subset;
mod tree_broadcast;

pub use dissemination_barrier::dissemination_barrier;
pub use generic::Generic;
pub use hierarchical::{hierarchical_allreduce, HostLayout};
pub use pairwise_alltoallv::pairwise_alltoallv;
pub use rail_thread::{threaded_rail_allreduce, RailThread};
pub use rails::{rail_allreduce, rail_parts};
pub use recursive_doubling::recursive_doubling_allreduce;
pub use ring_allgatherv::ring_allgatherv;
pub use ring_allreduce::{allreduce, ring_allreduce, SHORT_ALLREDUCE_BYTES};
pub use ring_reduce_scatter::ring_reduce_scatter;
pub use subset::Subset;
pub use tree_broadcast::tree_broadcast;

#[allow(unused_imports)] // The docs above link to these.
use crate::traits::{Collectives, Topology};

/// The first tag reserved for kolo itself: user `send` / `recv` tags must be
/// below it. `RESERVED_TAG_BASE..BACKEND_TAG_BASE` belongs to the generic
/// algorithms of this module, `BACKEND_TAG_BASE..` to backends' internal
/// messages.
pub const RESERVED_TAG_BASE: u32 = 0xFFFF_0000;

/// The first tag a backend may use for its own internal messages.
pub const BACKEND_TAG_BASE: u32 = 0xFFFF_8000;

const ALLREDUCE_TAG: u32 = RESERVED_TAG_BASE + 1;
const REDUCE_SCATTER_TAG: u32 = RESERVED_TAG_BASE + 2;
const ALLGATHER_TAG: u32 = RESERVED_TAG_BASE + 3;
const BROADCAST_TAG: u32 = RESERVED_TAG_BASE + 4;
const ALLTOALL_TAG: u32 = RESERVED_TAG_BASE + 5;
const BARRIER_TAG: u32 = RESERVED_TAG_BASE + 6;
/// All three phases of [`hierarchical_allreduce`]: two ranks meet either
/// in the cross-host phase alone or in both host phases, in order, so one
/// tag serves the three; it differs from the flat allreduce's, which a
/// communicator may interleave with it.
const HIERARCHICAL_TAG: u32 = RESERVED_TAG_BASE + 7;
