//! A disabled timeline never touches the allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kolo_timeline::{activity, Timeline};

/// Counts the allocations made by the current thread (the test harness's
/// other threads may allocate at any time).
struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count_one() {
    // try_with: the thread-local may already be gone while the thread exits.
    let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; the counting touches only a
// const-initialised thread-local `Cell`, which does not allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as is; `ptr` came from `System` via this allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; `ptr` came from `System` via this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn disabled_calls_do_not_allocate() {
    // The counter sees this thread's allocations: prove it before relying on it.
    let before = allocations();
    let probe = std::hint::black_box(vec![1u8; 16]);
    assert!(allocations() > before, "the counting allocator counts");
    drop(probe);

    let tensors = ["grad/w1", "grad/b1"];
    let before = allocations();
    let timeline = Timeline::disabled();
    let clone = timeline.clone();
    for _ in 0..1000 {
        clone.negotiate_start("grad/w1", "ALLREDUCE");
        clone.negotiate_rank_ready("grad/w1", 3);
        clone.negotiate_end("grad/w1");
        clone.op_start("grad/w1", "ALLREDUCE");
        clone.activity_start("grad/w1", activity::QUEUE);
        clone.activity_end("grad/w1");
        clone.activity_start_all(&tensors, activity::MEMCPY_IN_FUSION_BUFFER);
        clone.activity_end_all(&tensors);
        clone.op_end("grad/w1", "float32", &[1024, 1024]);
        clone.mark_cycle();
        std::hint::black_box(clone.is_enabled());
        std::hint::black_box(clone.flush().is_ok());
    }
    drop(clone);
    drop(timeline);
    assert_eq!(allocations() - before, 0, "a disabled timeline allocated");
}
