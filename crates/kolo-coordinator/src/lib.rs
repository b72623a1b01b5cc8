//! kolo-coordinator — CONTRACT STUB (the coordinator work replaces the bodies;
//! the facade codes against these signatures; changes to them must be
//! announced to the facade work).

use kolo_protocol::{Request, Response};
use kolo_transport::{Controller, TransportError};
use std::time::{Duration, Instant};

/// Settings of the negotiation.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Response-cache entries; 0 disables the cache.
    pub cache_capacity: usize,
    /// Warn about tensors that some ranks submitted and others did not after
    /// this long; `None` disables the warning.
    pub stall_warning: Option<Duration>,
    /// Fail stalled tensors on every rank and shut down after this long;
    /// `None` = never.
    pub stall_shutdown: Option<Duration>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            cache_capacity: 1024,
            stall_warning: Some(Duration::from_secs(60)),
            stall_shutdown: None,
        }
    }
}

/// Why a cycle failed (the engine then fails every pending handle with it).
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("rank {rank} sent a message that does not decode: {message}")]
    Decode { rank: usize, message: String },
}

/// Rank-0 events for the timeline: when negotiation of a tensor starts, when
/// each rank's request arrived, and when it ends.
#[derive(Clone, Debug, PartialEq)]
pub enum NegotiationEvent {
    Start { tensor: String, kind: kolo_protocol::RequestKind },
    RankReady { tensor: String, rank: u32 },
    End { tensor: String },
}

/// What one cycle decided; identical on every rank except `events` (rank 0
/// only) and `stats`.
#[derive(Clone, Debug, Default)]
pub struct CycleOutput {
    /// Responses to perform now, in the same order on every rank, unfused
    /// (one tensor per response; kolo-fusion fuses them locally, which is
    /// deterministic). Error responses included (stall errors too).
    pub responses: Vec<Response>,
    /// Every rank must stop after performing `responses`.
    pub shutdown: bool,
    /// The ranks that asked for the shutdown (empty unless `shutdown`), so
    /// that pending handles can fail naming them.
    pub shutdown_ranks: Vec<u32>,
    pub events: Vec<NegotiationEvent>,
    pub stats: CycleStats,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CycleStats {
    /// True when request lists were gathered to rank 0 this cycle (false
    /// when the response cache settled everything with bit vectors).
    pub gathered: bool,
    /// Responses that came from the cache this cycle.
    pub cache_hits: usize,
}

/// One rank's negotiation state.
pub struct Coordinator {
    _private: (),
}

impl Coordinator {
    pub fn new(_rank: usize, _size: usize, _config: CoordinatorConfig) -> Self {
        unimplemented!("coordinator work")
    }

    /// Runs one negotiation cycle over `ctrl` (a collective: every rank calls
    /// it). `requests` are this rank's requests enqueued since the last
    /// cycle; `shutdown` says this rank wants to stop; `now` drives the
    /// stall inspector.
    pub fn cycle<C: Controller + ?Sized>(
        &mut self,
        _ctrl: &mut C,
        _requests: Vec<Request>,
        _shutdown: bool,
        _now: Instant,
    ) -> Result<CycleOutput, CoordinatorError> {
        unimplemented!("coordinator work")
    }
}
