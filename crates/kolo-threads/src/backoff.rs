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

    /// Polls `ready` while spinning, then yielding; true as soon as it holds,
    /// false when the budget is spent (the caller then sleeps).
    pub(crate) fn spin_until(&self, mut ready: impl FnMut() -> bool) -> bool {
        if ready() {
            return true;
        }
        if !self.spin.is_zero() {
            let start = Instant::now();
            loop {
                for _ in 0..SPINS_PER_CHECK {
                    spin_loop();
                    if ready() {
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
                return true;
            }
            if yields >= MIN_YIELDS && start.elapsed() >= self.yield_for {
                break;
            }
        }
        false
    }
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
