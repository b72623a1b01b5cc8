//! The table's list of live submissions, seen from outside the submitting
//! path: forgetting the done ones, and what the watchdog and the desync
//! report read of it (the oldest pending submission, this rank's
//! standing).

use super::{Table, LIVE_SWEEP_FLOOR};
use crate::engine::completion::Completion;
use crate::engine::desync::{Op, Standing, LISTED};
use crate::engine::names::TensorNames;
use std::sync::Arc;

impl Table {
    /// Forgets done submissions: at each insert the ones before the first
    /// that is not done (they usually finish in the order submitted, so
    /// this is O(1) per insert: a burst of 1,000 separate submissions
    /// while the first is pending touches one entry each), and every done
    /// one once the list has doubled since the last sweep (amortized O(1)
    /// whatever the order).
    pub(super) fn prune_live(&mut self) {
        let done = self.live.iter().take_while(|(_, c)| c.is_done()).count();
        if let Some((seq, completion)) = done.checked_sub(1).map(|last| &self.live[last]) {
            note_done(&mut self.last_done, *seq, completion);
        }
        self.live.drain(..done);
        let live = &self.live;
        self.joins
            .retain(|seq| live.binary_search_by_key(seq, |(s, _)| *s).is_ok());
        if self.live.len() >= self.sweep_live_at.max(LIVE_SWEEP_FLOOR) {
            self.forget_every_done();
            self.sweep_live_at = 2 * self.live.len();
        }
    }

    /// Forgets every done submission of `live`, noting the last.
    pub(super) fn forget_every_done(&mut self) {
        if let Some((seq, completion)) = self.live.iter().rev().find(|(_, c)| c.is_done()) {
            note_done(&mut self.last_done, *seq, completion);
        }
        self.live.retain(|(_, c)| !c.is_done());
    }

    /// When the oldest submission still pending was made, if any; joins
    /// are not counted (they wait for the other ranks' work to end).
    pub(crate) fn oldest_pending(&self) -> Option<std::time::Instant> {
        self.live
            .iter()
            .filter(|(seq, c)| !c.is_done() && !self.joins.contains(seq))
            .map(|(_, c)| c.submitted())
            .min()
    }

    /// Where this rank (`rank`) stands at `now`: its last completed
    /// submission and its pending ones (see [`crate::engine::desync`]).
    pub(crate) fn standing(&self, rank: usize, now: std::time::Instant) -> Standing {
        let first = |names: &TensorNames| {
            if names.len() == 0 {
                String::new()
            } else {
                names.get(0).to_owned()
            }
        };
        let mut last_done = self.last_done.as_ref().map(|(seq, names)| (*seq, names));
        let mut pending = Vec::new();
        let mut pending_total = 0u64;
        for (seq, completion) in &self.live {
            if completion.is_done() {
                if last_done.is_none_or(|(last, _)| *seq > last) {
                    last_done = Some((*seq, completion.names()));
                }
                continue;
            }
            pending_total += 1;
            if pending.len() < LISTED {
                pending.push(Op {
                    seq: *seq,
                    tensor: first(completion.names()),
                    waited: now.saturating_duration_since(completion.submitted()),
                });
            }
        }
        Standing {
            rank,
            last_done: last_done.map(|(seq, names)| Op {
                seq,
                tensor: first(names),
                waited: std::time::Duration::ZERO,
            }),
            pending,
            pending_total,
        }
    }

    /// Takes every submission that may be in flight (the watchdog fails
    /// them once the table is closed).
    pub(crate) fn take_live(&mut self) -> Vec<Arc<Completion>> {
        std::mem::take(&mut self.live)
            .into_iter()
            .map(|(_, c)| c)
            .collect()
    }
}

/// Keeps the later of the last done submission noted and `seq`.
fn note_done(last: &mut Option<(u64, Arc<TensorNames>)>, seq: u64, completion: &Completion) {
    if last.as_ref().is_none_or(|(noted, _)| seq > *noted) {
        *last = Some((seq, Arc::clone(completion.names())));
    }
}
