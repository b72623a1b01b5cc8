//! The memory floor of an in-place allreduce on thread ranks: the least
//! memory traffic kolo-threads' in-place path can move, with no library
//! around it (no publication, verdict, schedule, segment table or engine).
//!
//! Each of `ranks` threads owns one `f32` buffer. A step is what
//! kolo-threads' in-place allreduce does: rank `r` takes chunk `r` of the
//! buffers and, run by run (`run_bytes` each), adds every peer's run into
//! its own and copies the sum into every peer's run while it is in cache
//! (each element read once per rank and written once per rank, the least
//! any allreduce that leaves the result in every buffer can do). Before
//! each step the buffers are refilled from a send copy, untimed, as
//! kolo-bench's engine mode does; the step is timed from a barrier to a
//! barrier, and the reported time per step is the slowest rank's.
//!
//! `kolo-bench`'s engine and direct modes compare with this to see how far
//! a collective is from what the machine can do (`memory-floor --help`).
//!
//! ```
//! let spec = kolo_bench::floor::FloorSpec {
//!     ranks: 2,
//!     bytes: 64 << 10,
//!     run_bytes: 4 << 10,
//!     iters: 3,
//!     warmup: 1,
//! };
//! let floor = kolo_bench::floor::measure(&spec)?;
//! assert_eq!(floor.times_us.len(), 3);
//! assert_eq!(floor.wrong, 0);
//! # Ok::<(), kolo_bench::BenchError>(())
//! ```

use crate::error::BenchError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloorSpec {
    /// Thread ranks (at least 1).
    pub ranks: usize,
    /// Bytes per rank's buffer (whole `f32`s).
    pub bytes: usize,
    /// Bytes per run (whole `f32`s, at least one).
    pub run_bytes: usize,
    /// Timed steps.
    pub iters: usize,
    /// Untimed steps first.
    pub warmup: usize,
}

/// What [`measure`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Floor {
    /// Per timed step, the slowest rank's time (µs).
    pub times_us: Vec<f64>,
    /// Elements of the last step's buffers (every rank's) that are not the
    /// sum of every rank's input.
    pub wrong: u64,
}

/// Rank `rank`'s input element `i` (small integers: exact in `f32` sums).
fn input(rank: usize, i: usize) -> f32 {
    ((rank * 7 + i) % 13) as f32
}

/// Runs `spec` and returns the slowest rank's time per timed step.
pub fn measure(spec: &FloorSpec) -> Result<Floor, BenchError> {
    let elem = std::mem::size_of::<f32>();
    if spec.ranks == 0 || spec.bytes % elem != 0 || spec.run_bytes < elem || spec.iters == 0 {
        return Err(BenchError::InvalidArgs(format!(
            "memory floor: {} ranks, {} bytes, runs of {} bytes, {} timed steps \
             (need at least 1 rank, whole f32s, runs of at least 4 bytes, 1 step)",
            spec.ranks, spec.bytes, spec.run_bytes, spec.iters
        )));
    }
    let len = spec.bytes / elem;
    let run = spec.run_bytes / elem;
    let mut buffers: Vec<Vec<f32>> = (0..spec.ranks).map(|_| vec![0.0; len]).collect();
    let shared = Shared {
        ptrs: buffers.iter_mut().map(|b| b.as_mut_ptr()).collect(),
        len,
    };
    let barrier = SpinBarrier::new(spec.ranks);
    let steps = spec.warmup + spec.iters;
    let per_rank: Vec<Vec<f64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..spec.ranks)
            .map(|rank| {
                let (shared, barrier) = (&shared, &barrier);
                s.spawn(move || {
                    // A panic here breaks the barrier: the other ranks stop
                    // at their next wait instead of waiting for this one.
                    let _breaks = BreaksOnPanic(barrier);
                    let send: Vec<f32> = (0..len).map(|i| input(rank, i)).collect();
                    let mut times = Vec::with_capacity(spec.iters);
                    for step in 0..steps {
                        // SAFETY: between the last step's closing barrier
                        // and this step's opening one, only this rank
                        // touches its own buffer (peers touch it only
                        // between the two barriers of a step).
                        unsafe { shared.own(rank) }.copy_from_slice(&send);
                        if !barrier.wait() {
                            break;
                        }
                        let start = Instant::now();
                        // SAFETY: between this step's two barriers, rank
                        // `rank` alone touches chunk `rank` of every buffer
                        // (the chunks of the ranks are disjoint).
                        unsafe { shared.reduce_chunk(rank, run) };
                        if !barrier.wait() {
                            break;
                        }
                        if step >= spec.warmup {
                            times.push(start.elapsed().as_secs_f64() * 1e6);
                        }
                    }
                    times
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    drop(shared);
    if per_rank.iter().any(|t| t.len() != spec.iters) {
        return Err(BenchError::InvalidArgs(
            "memory floor: a rank's thread panicked".into(),
        ));
    }
    let times_us = (0..spec.iters)
        .map(|i| per_rank.iter().map(|t| t[i]).fold(0.0, f64::max))
        .collect();
    let expected = |i: usize| (0..spec.ranks).map(|r| input(r, i)).sum::<f32>();
    let wrong = buffers
        .iter()
        .flat_map(|b| b.iter().enumerate())
        .filter(|&(i, &x)| x != expected(i))
        .count() as u64;
    Ok(Floor { times_us, wrong })
}

/// The ranks' buffers, reachable from every rank's thread.
struct Shared {
    ptrs: Vec<*mut f32>,
    len: usize,
}

// SAFETY: `Shared` is only addresses of `f32` buffers that outlive the
// scoped threads using it; every access goes through `own` and
// `reduce_chunk`, whose callers keep the accesses of different threads to
// disjoint elements between barriers (see `measure`).
unsafe impl Sync for Shared {}

impl Shared {
    /// Rank `rank`'s whole buffer.
    ///
    /// # Safety
    ///
    /// No other thread touches that buffer while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn own(&self, rank: usize) -> &mut [f32] {
        // SAFETY: `ptrs[rank]` is the start of a live buffer of `len`
        // elements; the caller rules out other accesses.
        unsafe { std::slice::from_raw_parts_mut(self.ptrs[rank], self.len) }
    }

    /// Chunk `rank` of the buffers, reduced in place run by run: the sum
    /// of every rank's run into rank `rank`'s, then copied into every
    /// peer's.
    ///
    /// # Safety
    ///
    /// No other thread touches chunk `rank` of any buffer meanwhile.
    unsafe fn reduce_chunk(&self, rank: usize, run: usize) {
        let ranks = self.ptrs.len();
        let (lo, hi) = (self.len * rank / ranks, self.len * (rank + 1) / ranks);
        let mut at = lo;
        while at < hi {
            let n = run.min(hi - at);
            // SAFETY: `at..at + n` lies in chunk `rank` of every buffer
            // (each `len` long); the caller gives this thread sole use of
            // those elements, and the buffers are distinct allocations, so
            // `own` aliases no peer slice.
            let own = unsafe { std::slice::from_raw_parts_mut(self.ptrs[rank].add(at), n) };
            for peer in (0..ranks).filter(|&p| p != rank) {
                // SAFETY: as above, read only while `own` is written.
                let theirs = unsafe { std::slice::from_raw_parts(self.ptrs[peer].add(at), n) };
                for (x, y) in own.iter_mut().zip(theirs) {
                    *x += *y;
                }
            }
            for peer in (0..ranks).filter(|&p| p != rank) {
                // SAFETY: as above; no other slice of this peer's run lives.
                let theirs = unsafe { std::slice::from_raw_parts_mut(self.ptrs[peer].add(at), n) };
                theirs.copy_from_slice(own);
            }
            at += n;
        }
    }
}

/// A barrier that spins and yields (no sleep): the ranks leave within a
/// scheduler pass of the last arrival, as kolo-threads' barrier does while
/// its ranks fit the cores. A rank that panicked breaks it.
struct SpinBarrier {
    ranks: usize,
    arrived: AtomicUsize,
    broken: AtomicBool,
}

impl SpinBarrier {
    fn new(ranks: usize) -> Self {
        SpinBarrier {
            ranks,
            arrived: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
        }
    }

    /// Waits until every rank has called `wait` as often as this one, and
    /// returns true; false if the barrier broke first (the caller then
    /// stops touching the buffers). Arrivals before it happen-before a
    /// true return (release/acquire on the counter).
    fn wait(&self) -> bool {
        let mine = self.arrived.fetch_add(1, Ordering::AcqRel) + 1;
        // The generation this arrival belongs to ends at a multiple of ranks.
        let target = mine.div_ceil(self.ranks) * self.ranks;
        while self.arrived.load(Ordering::Acquire) < target {
            if self.broken.load(Ordering::Acquire) {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }
}

/// Breaks the barrier if dropped while its thread unwinds.
struct BreaksOnPanic<'b>(&'b SpinBarrier);

impl Drop for BreaksOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.broken.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_buffer_ends_with_the_sum_for_any_ranks_and_runs() {
        for ranks in 1..=4 {
            for (bytes, run_bytes) in [(0, 4), (4, 4), (1000, 12), (4096, 4096), (4100, 64)] {
                let spec = FloorSpec {
                    ranks,
                    bytes,
                    run_bytes,
                    iters: 2,
                    warmup: 1,
                };
                let floor = measure(&spec).unwrap();
                assert_eq!(floor.times_us.len(), 2, "{spec:?}");
                assert_eq!(floor.wrong, 0, "{spec:?}");
            }
        }
    }

    #[test]
    fn a_rank_that_panics_breaks_the_barrier_instead_of_hanging_the_others() {
        let barrier = SpinBarrier::new(2);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| barrier.wait());
            let panicker = s.spawn(|| {
                let _breaks = BreaksOnPanic(&barrier);
                panic!("a rank fails before its first wait");
            });
            assert!(panicker.join().is_err());
            assert!(
                !waiter.join().unwrap(),
                "the waiter is told the barrier broke"
            );
        });
        // Unbroken, every rank passes.
        let whole = SpinBarrier::new(2);
        std::thread::scope(|s| {
            let a = s.spawn(|| whole.wait() && whole.wait());
            assert!(whole.wait() && whole.wait());
            assert!(a.join().unwrap());
        });
    }

    #[test]
    fn a_malformed_spec_is_an_error_naming_it() {
        let spec = FloorSpec {
            ranks: 2,
            bytes: 6,
            run_bytes: 4,
            iters: 1,
            warmup: 0,
        };
        let err = measure(&spec).unwrap_err().to_string();
        assert!(err.contains("6 bytes"), "{err}");
    }
}
