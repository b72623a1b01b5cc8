//! Which ranks are down (failed or departed), and since which barrier.
//!
//! A rank goes down exactly once, from its own thread: `fail`, a failed
//! `run` closure, dropping its communicator, or abandoning a collective. The
//! record keeps the barrier generation current at that moment: the rank
//! never arrives at that barrier or any later one, so those barriers fail,
//! while a barrier it already passed still completes for the slower peers.

use kolo_transport::TransportError;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// One rank that went down.
#[derive(Clone, Debug, PartialEq, Eq)]
struct DownRecord {
    rank: usize,
    message: String,
    generation: u64,
}

impl DownRecord {
    fn error(&self) -> TransportError {
        TransportError::PeerFailed {
            rank: self.rank,
            message: self.message.clone(),
        }
    }
}

/// The failure state of every rank of one communicator.
#[derive(Debug)]
pub(crate) struct Health {
    /// The lowest generation of any record (`u64::MAX` while all are up):
    /// the lock-free check of every wait loop.
    earliest: AtomicU64,
    down: Box<[AtomicBool]>,
    /// Records in the order the ranks went down.
    records: Mutex<Vec<DownRecord>>,
}

impl Health {
    pub(crate) fn new(size: usize) -> Self {
        Health {
            earliest: AtomicU64::new(u64::MAX),
            down: (0..size).map(|_| AtomicBool::new(false)).collect(),
            records: Mutex::new(Vec::new()),
        }
    }

    /// Records `rank` as down since barrier `generation`; false (and no
    /// change) if it already was.
    pub(crate) fn mark(&self, rank: usize, message: String, generation: u64) -> bool {
        let mut records = self.records.lock();
        let Some(flag) = self.down.get(rank) else {
            return false;
        };
        if flag.load(Ordering::SeqCst) {
            return false;
        }
        records.push(DownRecord {
            rank,
            message,
            generation,
        });
        flag.store(true, Ordering::SeqCst);
        self.earliest.fetch_min(generation, Ordering::SeqCst);
        true
    }

    /// Lock-free: does some down rank keep barrier `generation` from
    /// completing (or make its completion a failure)?
    pub(crate) fn blocks(&self, generation: u64) -> bool {
        self.earliest.load(Ordering::SeqCst) <= generation
    }

    /// The first rank to go down that blocks barrier `generation`.
    pub(crate) fn blocker(&self, generation: u64) -> Option<TransportError> {
        if !self.blocks(generation) {
            return None;
        }
        let records = self.records.lock();
        records
            .iter()
            .find(|r| r.generation <= generation)
            .map(DownRecord::error)
    }

    /// Lock-free: is `rank` down?
    pub(crate) fn is_down(&self, rank: usize) -> bool {
        self.down
            .get(rank)
            .is_some_and(|flag| flag.load(Ordering::SeqCst))
    }

    /// `PeerFailed` for `rank` if it is down.
    pub(crate) fn failure_of(&self, rank: usize) -> Option<TransportError> {
        if !self.is_down(rank) {
            return None;
        }
        let records = self.records.lock();
        records
            .iter()
            .find(|r| r.rank == rank)
            .map(DownRecord::error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_mark_wins_and_blocks_from_its_generation() {
        let health = Health::new(3);
        assert!(!health.blocks(0));
        assert!(health.mark(2, "boom".into(), 5));
        assert!(!health.mark(2, "again".into(), 6));
        assert!(health.is_down(2));
        assert!(!health.is_down(1));
        assert!(!health.blocks(4));
        assert_eq!(health.blocker(4), None);
        let expected = TransportError::PeerFailed {
            rank: 2,
            message: "boom".into(),
        };
        assert_eq!(health.blocker(5), Some(expected.clone()));
        assert_eq!(health.failure_of(2), Some(expected));
        assert_eq!(health.failure_of(0), None);
    }

    #[test]
    fn blocker_is_the_earliest_record_that_applies() {
        let health = Health::new(4);
        health.mark(3, "left".into(), 9);
        health.mark(1, "boom".into(), 7);
        assert!(matches!(
            health.blocker(8),
            Some(TransportError::PeerFailed { rank: 1, .. })
        ));
        assert!(matches!(
            health.blocker(9),
            Some(TransportError::PeerFailed { rank: 3, .. })
        ));
        assert!(!health.mark(7, "no such rank".into(), 0));
    }
}
