//! How a rank waits: spin briefly, yield, then sleep.
//!
//! Two ranks on two idle cores meet within a microsecond, so spinning first
//! keeps small collectives fast; eight ranks on two cores would starve each
//! other by spinning, so a communicator with more ranks than cores skips
//! straight to yielding and then sleeping on a condition variable.
//!
//! The yield phase is bounded by time, not by a count: on a loaded machine
//! the peer is often descheduled for longer than the spin, and a waiter
//! that went to sleep then pays a futex wake-up (tens of microseconds) on
//! every small collective. Yielding gives the core to whoever needs it
//! while keeping the wake-up cost at one scheduler pass (OpenMPI's
//! `yield_when_idle` does the same, without ever sleeping).
//!
//! The spin is adaptive, per thread ([`SpinHistory`]). Even with no more
//! ranks than cores, the scheduler may put two ranks' threads on one core
//! and leave them there (under `SCHED_FIFO`, or while every thread yields
//! instead of sleeping, nothing moves them): a rank spinning for its peer
//! then keeps that very peer off the core for the whole spin. Through
//! kolo's engine (two threads per rank) a 4-byte allreduce took ~100 us
//! instead of ~10 in about one process in fifteen on a 2-core machine.
//! A spin that fails and is followed by the peer arriving within a few
//! yields is that signature; after two of them the thread stops spinning,
//! and tries again every [`SpinHistory::PROBE_EVERY`] waits.

use std::cell::Cell;
use std::hint::spin_loop;
use std::thread;
use std::time::{Duration, Instant};

/// Spins between clock reads.
const SPINS_PER_CHECK: u32 = 64;

/// Yields before the time budget is looked at.
const MIN_YIELDS: u32 = 16;

/// The spin-then-yield budget spent before a waiter sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    spin: Duration,
    yield_for: Duration,
}

impl Backoff {
    /// The budget for `ranks` threads on `cores` cores.
    pub(crate) const fn for_ranks(ranks: usize, cores: usize) -> Self {
        if ranks <= cores {
            Backoff {
                spin: Duration::from_micros(20),
                yield_for: Duration::from_micros(500),
            }
        } else {
            Backoff {
                spin: Duration::ZERO,
                yield_for: Duration::ZERO,
            }
        }
    }

    /// Polls `ready` while spinning (unless this thread's recent spins did
    /// not pay off), then yielding; true as soon as it holds, false when
    /// the budget is spent (the caller then sleeps).
    pub(crate) fn spin_until(&self, mut ready: impl FnMut() -> bool) -> bool {
        if ready() {
            return true;
        }
        let spun = !self.spin.is_zero() && with_spins(SpinHistory::spin_now);
        if spun {
            let start = Instant::now();
            loop {
                for _ in 0..SPINS_PER_CHECK {
                    spin_loop();
                    if ready() {
                        with_spins(SpinHistory::caught_spinning);
                        return true;
                    }
                }
                if start.elapsed() >= self.spin {
                    break;
                }
            }
        }
        // At least MIN_YIELDS polls, however slow the clock or the
        // scheduler, then until the time budget is spent.
        let start = Instant::now();
        for yields in 1u32.. {
            thread::yield_now();
            if ready() {
                if spun {
                    with_spins(|h| h.caught_yielding(yields));
                }
                return true;
            }
            if yields >= MIN_YIELDS && start.elapsed() >= self.yield_for {
                break;
            }
        }
        false
    }
}

/// Whether a thread's recent spins paid off (see the module docs): pure
/// bookkeeping, kept per thread by [`Backoff::spin_until`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpinHistory {
    /// Spins allowed before the next one is skipped; refilled by a spin
    /// that caught its peer.
    credit: u8,
    /// Waits that skipped the spin since it stopped.
    skipped: u8,
}

impl Default for SpinHistory {
    fn default() -> Self {
        SpinHistory {
            credit: SpinHistory::FULL,
            skipped: 0,
        }
    }
}

impl SpinHistory {
    /// The credit a successful spin restores.
    const FULL: u8 = 4;
    /// What one spin that kept its peer off the core costs.
    const COLOCATED: u8 = 2;
    /// A peer that arrives within this many yields after a failed spin
    /// was waiting for this thread's core.
    const SOON: u32 = 4;
    /// While spinning is off, every this many waits spin anyway (the
    /// threads may have moved apart since).
    pub(crate) const PROBE_EVERY: u8 = 64;

    /// Whether the next wait spins (counting it if it does not).
    pub(crate) fn spin_now(&mut self) -> bool {
        if self.credit > 0 {
            return true;
        }
        self.skipped = self.skipped.wrapping_add(1) % Self::PROBE_EVERY;
        self.skipped == 0
    }

    /// The wait's spin saw the peer arrive.
    pub(crate) fn caught_spinning(&mut self) {
        *self = SpinHistory::default();
    }

    /// The wait's spin failed and the peer arrived after `yields` yields.
    pub(crate) fn caught_yielding(&mut self, yields: u32) {
        if yields <= Self::SOON {
            self.credit = self.credit.saturating_sub(Self::COLOCATED);
        }
    }
}

thread_local! {
    /// This thread's [`SpinHistory`].
    static SPINS: Cell<SpinHistory> = Cell::new(SpinHistory::default());
}

/// Applies `f` to this thread's [`SpinHistory`]; returns what it returns.
fn with_spins<R>(f: impl FnOnce(&mut SpinHistory) -> R) -> R {
    SPINS.with(|cell| {
        let mut history = cell.get();
        let result = f(&mut history);
        cell.set(history);
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversubscribed_ranks_do_not_spin() {
        assert_eq!(Backoff::for_ranks(8, 2).spin, Duration::ZERO);
        assert!(Backoff::for_ranks(2, 2).spin > Duration::ZERO);
    }

    #[test]
    fn spinning_stops_where_it_keeps_the_peer_off_the_core_and_is_probed_again() {
        let mut h = SpinHistory::default();
        // A peer on another core: caught while spinning, again and again.
        for _ in 0..10 {
            assert!(h.spin_now());
            h.caught_spinning();
        }
        // A slow peer (many yields after the spin): no sign of sharing.
        for _ in 0..10 {
            assert!(h.spin_now());
            h.caught_yielding(SpinHistory::SOON + 1);
        }
        // The peer arrives as soon as this thread yields: twice, and the
        // spin stops.
        for _ in 0..2 {
            assert!(h.spin_now());
            h.caught_yielding(1);
        }
        let skipped = (1..=200).filter(|_| !h.spin_now()).count();
        // One probe every PROBE_EVERY waits: 200 waits, 3 probes.
        assert_eq!(skipped, 200 - 3);
        // A probe that catches the peer spinning turns it back on.
        h.caught_spinning();
        assert!((0..10).all(|_| h.spin_now()));
    }

    #[test]
    fn spin_until_skips_the_spin_by_the_threads_history_and_probes() {
        // On a fresh thread: the history is per thread.
        std::thread::spawn(|| {
            let backoff = Backoff::for_ranks(2, 2);
            with_spins(|h| {
                h.caught_yielding(1);
                h.caught_yielding(1);
            });
            // Ready at the second poll: the first yield, the spin skipped.
            let mut polls = 0;
            assert!(backoff.spin_until(|| {
                polls += 1;
                polls == 2
            }));
            assert_eq!(with_spins(|h| h.skipped), 1, "the wait skipped its spin");
            // The next wait is a probe; ready at its second poll, in the spin.
            with_spins(|h| h.skipped = SpinHistory::PROBE_EVERY - 1);
            let mut polls = 0;
            assert!(backoff.spin_until(|| {
                polls += 1;
                polls == 2
            }));
            assert_eq!(
                with_spins(|h| *h),
                SpinHistory::default(),
                "the probe caught its peer spinning"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn gives_up_after_the_budget_and_stops_when_ready() {
        for backoff in [Backoff::for_ranks(2, 2), Backoff::for_ranks(8, 2)] {
            assert!(!backoff.spin_until(|| false));
            // The first check, a whole spin batch or the yields all poll at
            // least ten times, however slow the clock.
            let mut polls = 0;
            assert!(backoff.spin_until(|| {
                polls += 1;
                polls == 10
            }));
            assert_eq!(polls, 10);
        }
    }
}
