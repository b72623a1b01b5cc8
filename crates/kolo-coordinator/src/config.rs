//! The settings of the negotiation.

use std::time::Duration;

/// Settings of the negotiation. Every rank must use the same values (the
/// ranks' caches must fill and evict alike; a cycle fails on every rank
/// with [`crate::CoordinatorError::CacheCapacityMismatch`] when the
/// capacities differ).
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Response-cache entries; 0 disables the cache. Nothing is allocated
    /// by it: memory and the per-cycle bit vector grow with the entries
    /// used (clamped to [`crate::response_cache::MAX_CAPACITY`]).
    pub cache_capacity: usize,
    /// Warn about tensors that some ranks submitted and others did not after
    /// this long; `None` disables the warning.
    pub stall_warning: Option<Duration>,
    /// Fail stalled tensors on every rank and shut down after this long;
    /// `None` = never.
    pub stall_shutdown: Option<Duration>,
    /// Rank 0 reports [`crate::NegotiationEvent`]s for the timeline; off,
    /// it does not build them (two strings per tensor per cycle).
    pub events: bool,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            cache_capacity: 1024,
            stall_warning: Some(Duration::from_secs(60)),
            stall_shutdown: None,
            events: true,
        }
    }
}

impl CoordinatorConfig {
    /// How long a tensor may wait on the cache path before rank 0 moves it
    /// to the message table, where the stall inspector can name its ranks:
    /// the shorter of the warning and shutdown times (`None` when both are
    /// off).
    pub fn cache_stall_threshold(&self) -> Option<Duration> {
        match (self.stall_warning, self.stall_shutdown) {
            (Some(w), Some(s)) => Some(w.min(s)),
            (w, s) => w.or(s),
        }
    }
}
