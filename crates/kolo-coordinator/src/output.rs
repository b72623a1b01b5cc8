//! What a cycle decided.

use crate::names::TensorId;
use kolo_protocol::{RequestKind, Response};
use std::sync::Arc;

/// Rank-0 events for the timeline: when negotiation of a tensor starts, when
/// each rank's request arrived, and when it ends.
#[derive(Clone, Debug, PartialEq)]
pub enum NegotiationEvent {
    /// The tensor's first request arrived (for a cache hit: it was agreed on).
    Start {
        /// The tensor's name.
        tensor: String,
        /// Its collective.
        kind: RequestKind,
    },
    /// `rank`'s request for the tensor arrived at rank 0.
    RankReady {
        /// The tensor's name.
        tensor: String,
        /// The rank whose request arrived.
        rank: u32,
    },
    /// The tensor's response was decided (validated, failed or cached).
    End {
        /// The tensor's name.
        tensor: String,
    },
}

/// One response to perform, with this rank's tensor for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Agreed {
    /// The response (shared with the response cache for a hit).
    pub response: Arc<Response>,
    /// This rank's id for the response's tensor when the response names
    /// one tensor and settles a request this rank has in flight; `None` for
    /// names this rank did not submit (it joined, or a stall error for a
    /// tensor it lacks) and for responses with several names (a join).
    pub id: Option<TensorId>,
}

impl std::ops::Deref for Agreed {
    type Target = Response;

    fn deref(&self) -> &Response {
        &self.response
    }
}

/// A cache hit every rank agreed on: the response is the one in `slot` of
/// the rank's response cache ([`crate::Coordinator::cache`]), kept there
/// (not evicted) until the next cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// The cache slot.
    pub slot: usize,
    /// This rank's id for the slot's tensor.
    pub id: Option<TensorId>,
}

/// What one cycle decided; identical on every rank except `events` (rank 0
/// only), `stats` and the responses' ids.
#[derive(Clone, Debug, Default)]
pub struct CycleOutput {
    /// Responses to perform now, in the same order on every rank, unfused
    /// (one tensor per response; kolo-fusion fuses them locally, which is
    /// deterministic): rank 0's decisions of this cycle, then [`hits`](Self::hits).
    /// Error responses included (stall errors too). A rank ignores
    /// responses for names it never submitted (a stall error for a tensor
    /// it lacks) unless it has joined.
    pub responses: Vec<Agreed>,
    /// The cache hits every rank agreed on, in slot order, performed after
    /// `responses`: their responses stay in the cache, so a cycle settled by
    /// the cache hands over slots only (empty when the output came from
    /// [`crate::Coordinator::cycle_requests`], which appends them to
    /// `responses`).
    pub hits: Vec<Hit>,
    /// Every rank must stop after performing `responses`.
    pub shutdown: bool,
    /// The ranks that asked for the shutdown (empty unless `shutdown`), so
    /// that pending handles can fail naming them.
    pub shutdown_ranks: Vec<u32>,
    /// The shutdown comes from the stall inspector: `responses` holds the
    /// stall errors naming the tensors and ranks (possibly together with
    /// `shutdown_ranks`).
    pub stall_shutdown: bool,
    /// Timeline events (rank 0 only).
    pub events: Vec<NegotiationEvent>,
    /// How the cycle went on this rank.
    pub stats: CycleStats,
}

/// How one cycle went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CycleStats {
    /// True when request lists were gathered to rank 0 this cycle (false
    /// when the response cache settled everything with bit vectors).
    pub gathered: bool,
    /// Responses that came from the cache this cycle.
    pub cache_hits: usize,
}
