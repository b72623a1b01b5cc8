//! A pool of reusable objects (CUDA events): creating an event costs a
//! driver call, recording a free one costs nothing extra. Events taken for
//! an operation return when the completion thread has seen them complete.
//! Generic over the pooled type so the bookkeeping is tested without a GPU.

use crate::error::NcclError;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Free objects waiting for reuse, and counters.
#[derive(Debug)]
pub struct Pool<E> {
    free: Mutex<Vec<E>>,
    max_idle: usize,
    created: AtomicUsize,
    reused: AtomicUsize,
    dropped: AtomicUsize,
}

/// The pool's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Objects created because none was free.
    pub created: usize,
    /// Takes served from the free list.
    pub reused: usize,
    /// Objects returned while `max_idle` were already free (released).
    pub dropped: usize,
    /// Objects free now.
    pub idle: usize,
}

impl<E> Pool<E> {
    /// An empty pool keeping at most `max_idle` free objects.
    pub fn new(max_idle: usize) -> Self {
        Pool {
            free: Mutex::new(Vec::new()),
            max_idle,
            created: AtomicUsize::new(0),
            reused: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
        }
    }

    /// A free object (the most recently returned: warm in the driver's
    /// caches), or a new one from `create`.
    pub fn take(&self, create: impl FnOnce() -> Result<E, NcclError>) -> Result<E, NcclError> {
        if let Some(e) = self.free.lock().pop() {
            self.reused.fetch_add(1, Ordering::Relaxed);
            return Ok(e);
        }
        let e = create()?;
        self.created.fetch_add(1, Ordering::Relaxed);
        Ok(e)
    }

    /// Returns `e` for reuse; beyond `max_idle` free objects it is dropped
    /// (outside the lock: dropping an event is a driver call).
    pub fn put(&self, e: E) {
        let mut free = self.free.lock();
        if free.len() < self.max_idle {
            free.push(e);
            return;
        }
        drop(free);
        self.dropped.fetch_add(1, Ordering::Relaxed);
        drop(e);
    }

    /// The counters now.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            created: self.created.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            idle: self.free.lock().len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reuses_the_most_recently_returned_object() {
        let pool = Pool::new(4);
        let mut next = 0;
        let mut make = || {
            next += 1;
            Ok(next)
        };
        let a = pool.take(&mut make).unwrap();
        let b = pool.take(&mut make).unwrap();
        assert_eq!((a, b), (1, 2));
        pool.put(a);
        pool.put(b);
        assert_eq!(pool.take(&mut make).unwrap(), 2);
        assert_eq!(pool.take(&mut make).unwrap(), 1);
        assert_eq!(pool.take(&mut make).unwrap(), 3);
        assert_eq!(
            pool.stats(),
            PoolStats {
                created: 3,
                reused: 2,
                dropped: 0,
                idle: 0
            }
        );
    }

    #[test]
    fn a_failed_create_is_returned_and_not_counted() {
        let pool: Pool<u32> = Pool::new(1);
        let err = pool
            .take(|| {
                Err(NcclError::Cuda {
                    call: "cuEventCreate",
                    message: "out of memory".into(),
                })
            })
            .unwrap_err();
        assert!(err.to_string().contains("cuEventCreate"));
        assert_eq!(pool.stats().created, 0);
    }

    proptest! {
        /// Whatever the order of takes and returns, every object is either
        /// held, idle, or dropped, idle never exceeds the bound, and nothing
        /// is created while one is idle.
        #[test]
        fn accounts_for_every_object(ops in proptest::collection::vec(any::<bool>(), 0..200), max_idle in 0usize..6) {
            let pool = Pool::new(max_idle);
            let mut held = Vec::new();
            let mut next = 0u32;
            for take in ops {
                if take || held.is_empty() {
                    let idle_before = pool.stats().idle;
                    let created_before = pool.stats().created;
                    held.push(pool.take(|| { next += 1; Ok(next) }).unwrap());
                    prop_assert_eq!(pool.stats().created - created_before, usize::from(idle_before == 0));
                } else {
                    pool.put(held.pop().unwrap());
                }
                let s = pool.stats();
                prop_assert!(s.idle <= max_idle);
                prop_assert_eq!(s.created, held.len() + s.idle + s.dropped);
                prop_assert_eq!(s.created as u32, next);
            }
        }
    }
}
