//! Leases on the caller's memory: a scope ([`crate::Scope`], the GPU
//! engine's device scope) hands the engine tensors it borrowed, each with a
//! [`Lease`], and does not end before every lease is back.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// The leases a scope gave out and not yet got back.
#[derive(Default)]
pub(crate) struct Leases {
    out: Mutex<usize>,
    returned: Condvar,
}

impl Leases {
    /// A new lease on one tensor.
    pub(crate) fn lease(self: &Arc<Self>) -> Lease {
        *self.out.lock() += 1;
        Lease {
            leases: Arc::clone(self),
        }
    }

    /// Blocks until every lease is released. Terminates: a lease is
    /// released when the engine drops its entry — performed, failed, or
    /// drained when the engine stops (or its thread unwinds).
    pub(crate) fn wait_all(&self) {
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
