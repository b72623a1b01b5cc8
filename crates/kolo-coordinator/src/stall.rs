//! The stall inspector: tensors that some ranks submitted and others did not
//! for too long.
//!
//! On rank 0's message table this is [`stalled`]: every entry older than a
//! threshold, with the ranks that submitted it and the (non-joined) ranks
//! that did not. [`StallInspector`] turns that into warnings at most once per
//! tensor per warning period.
//!
//! Tensors that hit the response cache never reach the table; they wait on
//! the bit path. Rank 0 sees them there as slots that *some* rank has a hit
//! for (the OR of the hit bits) but not *every* rank (the AND).
//! [`CachePathStalls`] times such slots, and once one has waited for the
//! threshold rank 0 sets the slot's invalid bit in the next cycle: every rank
//! drops the entry and sends its pending request to rank 0, where the table
//! names the ranks and the ordinary inspector reports the tensor, its wait
//! counted from when the slot first waited on the bit path.

use crate::message_table::MessageTable;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tensor that some ranks submitted and others did not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StallReport {
    /// The tensor's name.
    pub tensor: String,
    /// Ranks that submitted it, ascending.
    pub submitted: Vec<u32>,
    /// Ranks (that have not joined) that did not, ascending.
    pub missing: Vec<u32>,
    /// How long since the first rank submitted it.
    pub waited: Duration,
}

impl StallReport {
    /// The message of the error response and of the warning:
    /// `tensor 'x' stalled for 5.0 s: submitted by ranks [0, 2], missing from ranks [1]`.
    pub fn message(&self) -> String {
        format!(
            "tensor '{}' stalled for {:.1} s: submitted by ranks {:?}, missing from ranks {:?}",
            self.tensor,
            self.waited.as_secs_f64(),
            self.submitted,
            self.missing
        )
    }
}

/// Every table entry that has waited at least `older_than` at `now`, in
/// table order. `joined` ranks are not counted as missing (a tensor that only
/// joined ranks lack is ready, not stalled).
pub fn stalled(
    table: &MessageTable,
    now: Instant,
    older_than: Duration,
    joined: &[u32],
) -> Vec<StallReport> {
    table
        .iter()
        .filter_map(|entry| {
            let waited = now.saturating_duration_since(entry.first_seen);
            if waited < older_than {
                return None;
            }
            let missing = entry.missing(joined);
            (!missing.is_empty()).then(|| StallReport {
                tensor: entry.name.clone(),
                submitted: entry.submitted(),
                missing,
                waited,
            })
        })
        .collect()
}

/// Rate-limits stall warnings: a stalled tensor is reported when it first
/// crosses the warning time and again once per warning period after that.
#[derive(Clone, Debug, Default)]
pub struct StallInspector {
    last_warned: HashMap<String, Instant>,
}

impl StallInspector {
    /// A new inspector that has warned about nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The reports among `stalled_now` (tensors stalled for at least
    /// `period` at `now`) that are due a warning; forgets tensors that are
    /// no longer stalled.
    pub fn due(
        &mut self,
        stalled_now: Vec<StallReport>,
        now: Instant,
        period: Duration,
    ) -> Vec<StallReport> {
        self.last_warned
            .retain(|name, _| stalled_now.iter().any(|r| &r.tensor == name));
        stalled_now
            .into_iter()
            .filter(|report| {
                let due = self
                    .last_warned
                    .get(&report.tensor)
                    .is_none_or(|&last| now.saturating_duration_since(last) >= period);
                if due {
                    self.last_warned.insert(report.tensor.clone(), now);
                }
                due
            })
            .collect()
    }
}

/// Rank 0's timer for cache slots that wait on the bit path (some ranks have
/// a hit, not all). Called every cycle, also while a fast rank waits for a
/// slow one: it keeps its list between cycles and allocates nothing while
/// the same slots keep waiting.
#[derive(Clone, Debug, Default)]
pub struct CachePathStalls {
    /// (slot, tensor name, since when it has been waiting), by slot.
    waiting: Vec<(usize, Arc<str>, Instant)>,
    /// The next list, built from the last one (kept for its allocation).
    next: Vec<(usize, Arc<str>, Instant)>,
}

/// A cache slot that waited on the bit path for the threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachePathStall {
    /// The slot to invalidate.
    pub slot: usize,
    /// The tensor cached in it.
    pub tensor: String,
    /// When it started waiting.
    pub since: Instant,
}

impl CachePathStalls {
    /// A timer tracking nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records this cycle's waiting slots (`(slot, tensor)`, ascending by
    /// slot, some rank has a hit that did not reach every rank) and returns
    /// those that have waited at least `threshold` at `now`. Slots not
    /// waiting any more, or now holding another tensor, restart.
    pub fn observe(
        &mut self,
        waiting: &[(usize, Arc<str>)],
        now: Instant,
        threshold: Duration,
    ) -> Vec<CachePathStall> {
        let mut last = self.waiting.iter().peekable();
        self.next.clear();
        for (slot, tensor) in waiting {
            while last.peek().is_some_and(|(s, ..)| s < slot) {
                last.next();
            }
            let since = match last.peek() {
                Some((s, name, since)) if s == slot && name == tensor => *since,
                _ => now,
            };
            self.next.push((*slot, Arc::clone(tensor), since));
        }
        std::mem::swap(&mut self.waiting, &mut self.next);
        self.waiting
            .iter()
            .filter(|(_, _, since)| now.saturating_duration_since(*since) >= threshold)
            .map(|(slot, tensor, since)| CachePathStall {
                slot: *slot,
                tensor: tensor.to_string(),
                since: *since,
            })
            .collect()
    }

    /// Forgets every slot (the bit path is paused while ranks are joined).
    pub fn clear(&mut self) {
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::{DataType, Request, RequestKind};
    use proptest::prelude::*;

    fn req(rank: u32, name: &str) -> Request {
        Request::new(rank, name, RequestKind::Allreduce, DataType::F32, vec![4])
    }

    #[test]
    fn names_submitted_and_missing_ranks() {
        let t0 = Instant::now();
        let mut table = MessageTable::new(3);
        for rank in [0, 2] {
            assert!(table.insert(req(rank, "x"), t0).is_ok());
        }
        assert!(table
            .insert(req(1, "young"), t0 + Duration::from_secs(4))
            .is_ok());
        let now = t0 + Duration::from_secs(5);
        let reports = stalled(&table, now, Duration::from_secs(5), &[]);
        assert_eq!(
            reports,
            vec![StallReport {
                tensor: "x".into(),
                submitted: vec![0, 2],
                missing: vec![1],
                waited: Duration::from_secs(5),
            }]
        );
        assert_eq!(
            reports[0].message(),
            "tensor 'x' stalled for 5.0 s: submitted by ranks [0, 2], missing from ranks [1]"
        );
        // Only joined ranks missing: ready, not stalled.
        assert!(stalled(&table, now, Duration::from_secs(1), &[1])
            .iter()
            .all(|r| r.tensor != "x"));
        assert!(stalled(&table, now, Duration::from_secs(6), &[]).is_empty());
    }

    #[test]
    fn warns_once_per_period() {
        let t0 = Instant::now();
        let mut table = MessageTable::new(2);
        assert!(table.insert(req(0, "x"), t0).is_ok());
        let period = Duration::from_secs(10);
        let mut inspector = StallInspector::new();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut warned = Vec::new();
        for s in 0..35 {
            let due = inspector.due(stalled(&table, at(s), period, &[]), at(s), period);
            if !due.is_empty() {
                warned.push(s);
            }
        }
        assert_eq!(warned, vec![10, 20, 30]);
    }

    #[test]
    fn cache_path_timer_restarts_when_a_slot_changes() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let th = Duration::from_secs(3);
        let mut timer = CachePathStalls::new();
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "c".into());
        assert!(timer
            .observe(&[(0, a.clone()), (1, b.clone())], at(0), th)
            .is_empty());
        assert!(timer
            .observe(&[(0, a.clone()), (1, c.clone())], at(2), th)
            .is_empty());
        let due = timer.observe(&[(0, a.clone()), (1, c.clone())], at(3), th);
        assert_eq!(
            due,
            vec![CachePathStall {
                slot: 0,
                tensor: "a".into(),
                since: at(0)
            }]
        );
        // Slot 0 settled (not waiting any more): forgotten.
        assert!(timer.observe(&[(1, c.clone())], at(4), th).is_empty());
        assert_eq!(timer.observe(&[(0, a), (1, c)], at(5), th).len(), 1);
    }

    proptest! {
        /// A tensor is reported exactly when it is old enough and some
        /// non-joined rank lacks it; submitted and missing partition the
        /// non-joined ranks together with the joined submitters.
        #[test]
        fn stalled_matches_definition(
            size in 1usize..6,
            subs in prop::collection::vec((0u32..6, 0u8..5, 0u64..20), 0..40),
            joined in prop::collection::btree_set(0u32..6, 0..3),
            now_s in 0u64..25,
            older in 0u64..15,
        ) {
            let t0 = Instant::now();
            let joined: Vec<u32> = joined.into_iter().filter(|&r| (r as usize) < size).collect();
            let mut table = MessageTable::new(size);
            for (rank, t, at) in subs {
                let _ = table.insert(req(rank, &format!("t{t}")), t0 + Duration::from_secs(at));
            }
            let now = t0 + Duration::from_secs(now_s);
            let reports = stalled(&table, now, Duration::from_secs(older), &joined);
            let expected: Vec<&str> = table
                .iter()
                .filter(|e| now.saturating_duration_since(e.first_seen) >= Duration::from_secs(older))
                .filter(|e| !e.is_ready(&joined))
                .map(|e| e.name.as_str())
                .collect();
            let got: Vec<&str> = reports.iter().map(|r| r.tensor.as_str()).collect();
            prop_assert_eq!(got, expected);
            for r in &reports {
                prop_assert!(!r.missing.is_empty());
                for rank in 0..size as u32 {
                    let sub = r.submitted.contains(&rank);
                    let mis = r.missing.contains(&rank);
                    prop_assert!(!(sub && mis));
                    prop_assert!(sub || mis || joined.contains(&rank));
                }
            }
        }
    }
}
