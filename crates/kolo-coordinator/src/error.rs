//! Why a cycle failed.

use kolo_transport::TransportError;

/// Why a cycle failed (the engine then fails every pending handle with it).
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The control plane failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A rank's request list (or rank 0's response list) did not decode.
    #[error("rank {rank} sent a message that does not decode: {message}")]
    Decode {
        /// The rank that sent it.
        rank: usize,
        /// The codec's explanation.
        message: String,
    },
    /// The ranks' response caches have different capacities (every rank
    /// must pass the same configuration); found by every rank in the same
    /// cycle, before the caches could disagree on a slot.
    #[error(
        "the ranks' response cache capacities differ (rank {rank} has {capacity}); \
         every rank must use the same cache capacity (KOLO_CACHE_CAPACITY, Config::cache_capacity)"
    )]
    CacheCapacityMismatch {
        /// The rank reporting.
        rank: usize,
        /// Its capacity.
        capacity: usize,
    },
    /// Rank 0 could not negotiate this cycle (for instance because another
    /// rank's request list did not decode) and told every rank to stop.
    #[error("the coordinator (rank 0) aborted the negotiation: {message}")]
    Aborted {
        /// Rank 0's reason.
        message: String,
    },
}
