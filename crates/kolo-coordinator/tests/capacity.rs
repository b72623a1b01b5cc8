//! The response cache's capacity is a bound, not a size: a huge one
//! allocates nothing by it, each cycle's bit vector follows the slots in
//! use, and ranks whose capacities differ fail together instead of
//! drifting apart.
//!
//! The binary counts its heap through its own global allocator, so that a
//! test can assert how much a run allocated at its peak.

mod common;

use common::{allreduce, config, cycle_until, run_ranks, world};
use kolo_coordinator::bit_vector::BitLayout;
use kolo_coordinator::response_cache::MAX_CAPACITY;
use kolo_coordinator::{Coordinator, CoordinatorError};
use kolo_protocol::{ReduceOp, Request, Response};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counters only observe the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's `layout` obligations pass through to System.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above (System) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `count` allreduces t0, t1, ... of rank `rank`.
fn step(rank: usize, count: usize) -> Vec<Request> {
    (0..count)
        .map(|t| allreduce(rank, &format!("t{t}"), 4, ReduceOp::Sum))
        .collect()
}

/// Three steps of `count` tensors on `size` ranks: every rank's responses
/// per step, the words of its last bit vector and its cache's extent.
fn three_steps(
    size: usize,
    capacity: usize,
    count: usize,
) -> Vec<(Vec<Vec<Response>>, usize, usize)> {
    run_ranks(size, &config(capacity), |rank, coordinator, ctrl| {
        let steps = (0..3)
            .map(|_| {
                cycle_until(coordinator, ctrl, step(rank, count), count, 20)
                    .iter()
                    .flat_map(|o| o.responses.iter().map(|a| (*a.response).clone()))
                    .collect()
            })
            .collect();
        (steps, ctrl.bitwise_words, coordinator.cache().extent())
    })
}

#[test]
fn a_capacity_of_a_billion_allocates_by_use_and_works() {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let huge = three_steps(2, 1_000_000_000, 10);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    // Sized by the capacity, the cache alone would take tens of GB; by
    // use, the whole run (threads, messages, other tests of this binary
    // running alongside) stays within a few MB.
    assert!(
        peak < 64 << 20,
        "a run with a cache of 10^9 entries peaked at {peak} bytes"
    );
    let small = three_steps(2, 16, 10);
    for ((steps, words, extent), (small_steps, _, _)) in huge.iter().zip(&small) {
        assert_eq!(steps, small_steps, "the same responses as a cache of 16");
        assert_eq!(steps, &huge[0].0, "the same responses on every rank");
        assert!(steps.iter().all(|s| s.len() == 10));
        assert_eq!(*extent, 10);
        assert_eq!(*words, BitLayout::new(2, 10).len());
    }
}

#[test]
fn the_bit_vector_follows_the_slots_in_use() {
    let results = run_ranks(2, &config(1_000_000_000), |rank, coordinator, ctrl| {
        let mut seen = Vec::new();
        for count in [3, 70, 200, 5] {
            cycle_until(coordinator, ctrl, step(rank, count), count, 20);
            // The next cycle agrees on the step again, over the slots used.
            let again = cycle_until(coordinator, ctrl, step(rank, count), count, 20);
            assert!(again.iter().all(|o| !o.stats.gathered), "rank {rank}");
            seen.push((ctrl.bitwise_words, coordinator.cache().extent()));
        }
        seen
    });
    // The slots in use never shrink: 5 tensors after 200 keep 200.
    let expected: Vec<(usize, usize)> = [3, 70, 200, 200]
        .iter()
        .map(|&slots| (BitLayout::new(2, slots).len(), slots))
        .collect();
    assert_eq!(results, [expected.clone(), expected]);
}

#[test]
fn a_full_cache_stops_growing_and_evicts() {
    let results = run_ranks(3, &config(50), |rank, coordinator, ctrl| {
        let first = cycle_until(coordinator, ctrl, step(rank, 120), 120, 20);
        let cached = cycle_until(coordinator, ctrl, step(rank, 120), 120, 20);
        let hits: usize = cached.iter().map(|o| o.stats.cache_hits).sum();
        let got: usize = first.iter().chain(&cached).map(|o| o.responses.len()).sum();
        (got, hits, coordinator.cache().extent(), ctrl.bitwise_words)
    });
    for (got, hits, extent, words) in results {
        assert_eq!(got, 240);
        assert!(hits <= 50, "{hits} hits from a cache of 50");
        assert_eq!(extent, 50);
        assert_eq!(words, BitLayout::new(3, 50).len());
    }
}

#[test]
fn capacities_that_differ_fail_every_rank_at_the_first_cycle() {
    let capacities = [16usize, 16, 32];
    let outcomes: Vec<Result<(), CoordinatorError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = world(3)
            .into_iter()
            .enumerate()
            .map(|(rank, mut ctrl)| {
                let mut coordinator = Coordinator::new(rank, 3, config(capacities[rank]));
                scope.spawn(move || {
                    coordinator
                        .cycle_requests(&mut ctrl, step(rank, 2), false, Instant::now())
                        .map(drop)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Err(CoordinatorError::CacheCapacityMismatch {
                rank: r,
                capacity: c,
            }) => {
                assert_eq!((r, c), (rank, capacities[rank]));
            }
            other => panic!("rank {rank}: expected a capacity mismatch, got {other:?}"),
        }
    }
}

#[test]
fn a_capacity_beyond_the_slot_numbers_is_clamped() {
    // usize::MAX and MAX_CAPACITY are the same cache: the ranks agree.
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = world(2)
            .into_iter()
            .zip([usize::MAX, MAX_CAPACITY])
            .enumerate()
            .map(|(rank, (mut ctrl, capacity))| {
                let mut coordinator = Coordinator::new(rank, 2, config(capacity));
                scope.spawn(move || {
                    let out = cycle_until(&mut coordinator, &mut ctrl, step(rank, 4), 4, 20);
                    let got: usize = out.iter().map(|o| o.responses.len()).sum();
                    (got, coordinator.cache().capacity())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect::<Vec<_>>()
    });
    assert_eq!(results, [(4, MAX_CAPACITY), (4, MAX_CAPACITY)]);
}
