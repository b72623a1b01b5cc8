//! Leases on the caller's memory: a scope ([`crate::Scope`], the GPU
//! engine's device scope) hands the engine tensors it borrowed, each with a
//! [`Lease`], and does not end before every lease is back.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long [`Leases::wait_all`] polls, yielding the CPU, before it sleeps:
/// the engine returns a lease right after it completed the tensor's
/// handle, so a scope that waited for the handle usually finds the lease
/// back within microseconds, and sleeping would cost a futex wake-up.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(500);

/// The leases a scope gave out and not yet got back.
#[derive(Default)]
pub(crate) struct Leases {
    out: Mutex<usize>,
    returned: Condvar,
    /// `out`, readable without the lock (written under it).
    outstanding: AtomicUsize,
}

impl Leases {
    /// A new lease on one tensor.
    pub(crate) fn lease(self: &Arc<Self>) -> Lease {
        let mut out = self.out.lock();
        *out += 1;
        self.outstanding.store(*out, Ordering::Release);
        drop(out);
        Lease {
            leases: Arc::clone(self),
        }
    }

    /// Blocks until every lease is released (polling briefly first).
    /// Terminates: a lease is released when the engine drops its entry —
    /// performed (device work: once the GPU finished or failed, which
    /// kolo-nccl bounds by its operation timeout), failed, or drained when
    /// the engine stops (or its thread unwinds).
    pub(crate) fn wait_all(&self) {
        let start = Instant::now();
        while self.outstanding.load(Ordering::Acquire) > 0 && start.elapsed() < POLL_BEFORE_SLEEP {
            std::thread::yield_now();
        }
        let mut out = self.out.lock();
        while *out > 0 {
            self.returned.wait(&mut out);
        }
    }
}

/// One tensor's claim on the caller's memory; released on drop.
pub(crate) struct Lease {
    leases: Arc<Leases>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut out = self.leases.out.lock();
        *out = out.saturating_sub(1);
        self.leases.outstanding.store(*out, Ordering::Release);
        if *out == 0 {
            self.leases.returned.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_all_returns_once_every_lease_is_back() {
        let leases = Arc::new(Leases::default());
        leases.wait_all();
        let (a, b) = (leases.lease(), leases.lease());
        let waiter = {
            let leases = Arc::clone(&leases);
            std::thread::spawn(move || leases.wait_all())
        };
        drop(a);
        assert_eq!(*leases.out.lock(), 1);
        drop(b);
        waiter.join().unwrap();
        assert_eq!(*leases.out.lock(), 0);
    }
}
