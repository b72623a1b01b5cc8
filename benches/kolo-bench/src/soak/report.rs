//! What one rank of the soak saw, and its memory samples.

use crate::soak::memory::{heap_in_use_kib, held_kib};
use kolo::{Error, Kolo};
use std::time::Duration;

/// What one rank saw.
#[derive(Clone, Debug, Default)]
pub struct SoakReport {
    /// Steps run.
    pub steps: u64,
    /// Operations checked.
    pub operations: u64,
    /// Result elements that differed from the reference.
    pub wrong: u64,
    /// The first wrong result, described.
    pub first_wrong: Option<String>,
    /// `(seconds since the start, resident KiB)` after every rank
    /// released its fusion buffers, sampled (rank 0).
    pub rss: Vec<(f64, u64)>,
    /// The resident KiB just before, with the fusion buffers (rank 0).
    pub rss_cached: Vec<u64>,
    /// The KiB of live heap allocations with each `rss` sample (rank 0).
    pub heap: Vec<u64>,
    /// This rank's fusion buffers in KiB at each sample (every rank).
    pub fusion_kib: Vec<u64>,
}

impl SoakReport {
    /// Samples memory between two steps (every rank calls it): every
    /// rank's step is over and its own buffers freed, so rank 0 samples
    /// what the process holds while the others wait, then again once
    /// every rank released its fusion buffers.
    pub(crate) fn sample(&mut self, kolo: &Kolo, elapsed: Duration) -> Result<(), Error> {
        self.fusion_kib.push(kolo.stats().fusion_buffer_bytes >> 10);
        if kolo.rank() == 0 {
            self.rss_cached.push(held_kib());
        }
        kolo.barrier()?;
        kolo.release_buffers()?;
        kolo.barrier()?;
        if kolo.rank() == 0 {
            self.rss.push((elapsed.as_secs_f64(), held_kib()));
            self.heap.push(heap_in_use_kib());
        }
        kolo.barrier()
    }
}
