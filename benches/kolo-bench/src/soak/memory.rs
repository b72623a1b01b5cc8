//! The soak's view of its process's memory: glibc's allocator settled so
//! that freed buffers go back to the system, and the resident memory read
//! from `/proc`.

/// Fixes glibc's mmap threshold at 128 KiB (its default start), as a
/// long-running job would with `MALLOC_MMAP_THRESHOLD_`: glibc otherwise
/// raises the threshold each time a large mapped buffer is freed, and
/// from then on serves buffers of up to 32 MiB from its per-thread arenas,
/// whose freed tops `malloc_trim` does not return — the soak's resident
/// memory then counts glibc's cache of the largest buffers each of its
/// many threads ever freed, not what kolo holds. Call once, first.
pub fn settle_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tunables; called before
    // any thread of the soak allocates.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// The resident memory this process holds, in KiB: after returning the
/// allocator's free memory to the system (glibc's arenas otherwise keep
/// the peaks of freed buffers, which says nothing of a leak).
pub fn held_kib() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
    resident_kib()
}

/// The bytes this process's live allocations take in glibc's heap (all
/// arenas and mapped chunks), in KiB: what a leak raises, unlike the
/// pages fragmentation keeps resident (0 off glibc).
pub fn heap_in_use_kib() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let info = unsafe { libc::mallinfo2() };
        ((info.uordblks + info.hblkhd) / 1024) as u64
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        0
    }
}

/// This process's resident memory in KiB (0 where /proc is missing).
pub fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}
