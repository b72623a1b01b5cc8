//! How a rank waits: spin briefly, yield, then sleep.
//!
//! Two ranks on two idle cores meet within a microsecond, so spinning first
//! keeps small collectives fast; eight ranks on two cores would starve each
//! other by spinning, so a communicator with more ranks than cores skips
//! straight to yielding and then sleeping on a condition variable.

use std::hint::spin_loop;
use std::thread;
use std::time::{Duration, Instant};

/// Spins between clock reads.
const SPINS_PER_CHECK: u32 = 64;

/// The spin-then-yield budget spent before a waiter sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    spin: Duration,
    yields: u32,
}

impl Backoff {
    /// The budget for `ranks` threads on `cores` cores.
    pub(crate) fn for_ranks(ranks: usize, cores: usize) -> Self {
        if ranks <= cores {
            Backoff {
                spin: Duration::from_micros(20),
                yields: 8,
            }
        } else {
            Backoff {
                spin: Duration::ZERO,
                yields: 16,
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
        for _ in 0..self.yields {
            thread::yield_now();
            if ready() {
                return true;
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
