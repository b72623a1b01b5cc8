//! The generation barrier every collective synchronises on.
//!
//! Arrivals are counted in an atomic; the last one resets the count and
//! bumps the generation. Waiters spin briefly on the generation (see
//! [`Backoff`]), then sleep on a condition variable that the last arrival
//! signals only when someone sleeps, so a barrier between spinning ranks
//! costs no system call. Every wait also watches [`Health`]: a rank that
//! went down before arriving fails the barrier for everyone.

use crate::backoff::Backoff;
use crate::health::Health;
use crossbeam_utils::CachePadded;
use kolo_transport::TransportError;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Whether a waiter may leave before the barrier completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Leave with an error as soon as a down rank blocks the barrier. For
    /// barriers before which no rank touches a peer's memory.
    Abortable,
    /// Wait until every rank has arrived, then report a down rank. For
    /// barriers inside a collective: leaving early could free a buffer a
    /// slower peer still reads, and every rank of the collective will
    /// arrive (a rank that abandons it arrives on its way out).
    Complete,
}

/// A reusable barrier for `size` ranks.
#[derive(Debug)]
pub(crate) struct Barrier {
    size: usize,
    arrived: CachePadded<AtomicUsize>,
    generation: CachePadded<AtomicU64>,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cond: Condvar,
}

impl Barrier {
    pub(crate) fn new(size: usize) -> Self {
        Barrier {
            size,
            arrived: CachePadded::new(AtomicUsize::new(0)),
            generation: CachePadded::new(AtomicU64::new(0)),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cond: Condvar::new(),
        }
    }

    /// The generation of the barrier not yet completed.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Counts this rank in and returns the generation it arrived at.
    fn arrive(&self) -> u64 {
        // The generation cannot move before this rank's arrival completes it.
        let generation = self.generation.load(Ordering::SeqCst);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.size {
            self.arrived.fetch_sub(self.size, Ordering::AcqRel);
            self.generation.store(generation + 1, Ordering::SeqCst);
            if self.sleepers.load(Ordering::SeqCst) > 0 {
                self.wake_all();
            }
        }
        generation
    }

    /// Arrives and waits for the others (see [`Wait`]). Fails with
    /// `PeerFailed` naming the first rank that went down before this
    /// barrier.
    pub(crate) fn wait(
        &self,
        health: &Health,
        backoff: &Backoff,
        mode: Wait,
    ) -> Result<(), TransportError> {
        let generation = self.arrive();
        let passed = || self.generation.load(Ordering::SeqCst) != generation;
        let give_up = || mode == Wait::Abortable && health.blocks(generation);
        if !backoff.spin_until(|| passed() || give_up()) {
            // Announce the sleeper before re-checking under the lock: the
            // last arrival stores the generation before it reads `sleepers`,
            // so one of the two sees the other.
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let mut guard = self.lock.lock();
            while !passed() && !give_up() {
                self.cond.wait(&mut guard);
            }
            drop(guard);
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        match health.blocker(generation) {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// Wakes every sleeper so it re-checks the generation and [`Health`].
    pub(crate) fn wake_all(&self) {
        let _guard = self.lock.lock();
        self.cond.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::thread;

    fn setup(size: usize) -> (Barrier, Health, Backoff) {
        (
            Barrier::new(size),
            Health::new(size),
            Backoff::for_ranks(size, 2),
        )
    }

    #[test]
    fn no_rank_passes_before_all_arrive_under_contention() {
        const RANKS: usize = 8;
        const ROUNDS: usize = 300;
        let (barrier, health, backoff) = setup(RANKS);
        let counter = AtomicUsize::new(0);
        thread::scope(|s| {
            for _ in 0..RANKS {
                s.spawn(|| {
                    for round in 0..ROUNDS {
                        counter.fetch_add(1, Ordering::SeqCst);
                        barrier.wait(&health, &backoff, Wait::Complete).unwrap();
                        // Everyone incremented for this round, nobody yet for the next.
                        assert_eq!(counter.load(Ordering::SeqCst), (round + 1) * RANKS);
                        barrier.wait(&health, &backoff, Wait::Complete).unwrap();
                    }
                });
            }
        });
        assert_eq!(barrier.generation(), (2 * ROUNDS) as u64);
    }

    #[test]
    fn a_rank_down_before_arriving_fails_the_waiters() {
        let (barrier, health, backoff) = setup(3);
        thread::scope(|s| {
            let waiters: Vec<_> = (0..2)
                .map(|_| s.spawn(|| barrier.wait(&health, &backoff, Wait::Abortable)))
                .collect();
            while barrier.arrived.load(Ordering::SeqCst) < 2 {
                thread::yield_now();
            }
            health.mark(2, "boom".into(), barrier.generation());
            barrier.wake_all();
            for waiter in waiters {
                let err = waiter.join().unwrap().unwrap_err();
                assert_eq!(
                    err,
                    TransportError::PeerFailed {
                        rank: 2,
                        message: "boom".into()
                    }
                );
            }
        });
        // Later barriers fail at once.
        assert!(barrier.wait(&health, &backoff, Wait::Abortable).is_err());
    }

    #[test]
    fn a_rank_down_after_passing_does_not_fail_the_barrier_it_passed() {
        let (barrier, health, backoff) = setup(2);
        thread::scope(|s| {
            let slow = s.spawn(|| barrier.wait(&health, &backoff, Wait::Abortable));
            barrier.wait(&health, &backoff, Wait::Abortable).unwrap();
            // Rank 1 passed generation 0 and leaves; generation 0 stays good.
            health.mark(
                1,
                "rank 1 left the communicator".into(),
                barrier.generation(),
            );
            barrier.wake_all();
            assert_eq!(slow.join().unwrap(), Ok(()));
        });
        assert!(barrier.wait(&health, &backoff, Wait::Abortable).is_err());
    }

    #[test]
    fn complete_waits_for_the_abandoning_rank_then_fails() {
        let (barrier, health, backoff) = setup(2);
        thread::scope(|s| {
            let waiter = s.spawn(|| barrier.wait(&health, &backoff, Wait::Complete));
            // The other rank abandons: marks itself down, then still arrives.
            health.mark(1, "abandoned".into(), barrier.generation());
            barrier.wake_all();
            let own = barrier.wait(&health, &backoff, Wait::Complete);
            assert!(own.is_err());
            assert!(matches!(
                waiter.join().unwrap(),
                Err(TransportError::PeerFailed { rank: 1, .. })
            ));
        });
        assert_eq!(barrier.generation(), 1);
    }
}
