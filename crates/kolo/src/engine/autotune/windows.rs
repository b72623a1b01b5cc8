//! Where one sample window ends: after a number of whole training steps,
//! found in the tensors the cycles performed. Pure: it is fed each cycle's
//! tensor names and bytes, which every rank has alike (the cycle output is
//! the same response sequence on every rank), so every rank finds the
//! same window ends at the same cycle without a word exchanged.

use rustc_hash::{FxHashSet, FxHasher};
use std::hash::{Hash, Hasher};

/// The most tensors one step holds: a job whose names never repeat (a new
/// name per operation) still forms windows, and the set of names stays
/// bounded.
pub(crate) const MAX_STEP_TENSORS: usize = 1 << 16;

/// Counts steps and bytes, and says when a window of whole steps ended.
///
/// A step ends where a tensor comes again: a training step submits each
/// gradient once, so the first cycle that performs a name already
/// performed in the current step starts the next step. Windows of whole
/// steps score alike however a step splits into cycles (a step whose
/// tensors arrive one per cycle, or all in one). A step also ends once it
/// has performed [`MAX_STEP_TENSORS`] tensors.
#[derive(Clone, Debug)]
pub(crate) struct Windows {
    steps_per_window: usize,
    /// The names performed in the current step (hashed: the set is only
    /// asked whether a name came before).
    seen: FxHashSet<u64>,
    /// Steps completed in the current window.
    steps: usize,
    /// Bytes performed in the current window.
    bytes: u64,
}

impl Windows {
    /// Windows of `steps_per_window` steps (at least one).
    pub(crate) fn new(steps_per_window: usize) -> Windows {
        Windows {
            steps_per_window: steps_per_window.max(1),
            seen: FxHashSet::default(),
            steps: 0,
            bytes: 0,
        }
    }

    /// Feeds one cycle: the names of the tensors it performed and their
    /// bytes. Returns the bytes of the window that ended just before this
    /// cycle, if one did (this cycle is then the first of the next
    /// window). Idle cycles (no names) change nothing.
    pub(crate) fn cycle<'n>(
        &mut self,
        names: impl IntoIterator<Item = &'n str>,
        bytes: u64,
    ) -> Option<u64> {
        let hashes: Vec<u64> = names.into_iter().map(hash).collect();
        let mut ended = None;
        let full = self.seen.len() >= MAX_STEP_TENSORS;
        if full || hashes.iter().any(|h| self.seen.contains(h)) {
            self.seen.clear();
            self.steps += 1;
            if self.steps >= self.steps_per_window {
                ended = Some(std::mem::take(&mut self.bytes));
                self.steps = 0;
            }
        }
        self.seen.extend(hashes);
        self.bytes = self.bytes.saturating_add(bytes);
        ended
    }
}

/// A name's hash: the same on every rank (FxHash has no random key).
fn hash(name: &str) -> u64 {
    let mut hasher = FxHasher::default();
    name.hash(&mut hasher);
    hasher.finish()
}
