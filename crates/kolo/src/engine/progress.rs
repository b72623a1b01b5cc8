//! A caller waiting for its own results runs the engine's cycles itself.
//!
//! A rank's engine state ([`Core`](crate::engine::cycle::Core)) sits behind
//! a lock that the background thread takes only to run a cycle. A handle's
//! waiter whose engine is free takes the lock and runs the cycles on its
//! own thread until its results are in, as an MPI library progresses
//! inside the call that waits. Its step then runs where its buffers were
//! just written (in that core's cache), and neither the hand-over to the
//! background thread nor the wake-up back costs anything (the engine side
//! is in [`crate::engine::background`]). The background thread keeps every other
//! duty: it serves submissions nobody waits for (the overlap of a step's
//! collectives with the caller's computation), idle cycles, shutdown and
//! aborts. A waiter that leaves work behind (another thread's
//! submission, a request the peers have not agreed to yet) wakes it.
//!
//! Only host engines on a `Send` backend share their state this way
//! ([`Kolo::start`](crate::Kolo::start) and
//! [`Kolo::start_with_abort`](crate::Kolo::start_with_abort): kolo-threads,
//! or any backend that may move between threads); backends that must stay
//! on one thread (MPI initialised as `MPI_THREAD_FUNNELED`, NCCL) and GPU
//! engines keep every cycle on the engine's thread.

use std::time::Instant;

/// An engine whose cycles a waiting caller may run (see the module docs).
pub(crate) trait Progress: Send + Sync {
    /// If no other thread is running the engine's cycles, runs them on
    /// this thread while there is work, until `done` holds or `deadline`
    /// has passed; wakes the background thread if work is left then.
    /// Returns false, having run nothing, when another thread held the
    /// engine.
    fn run_until(&self, done: &dyn Fn() -> bool, deadline: Instant) -> bool;

    /// Wakes the background thread (a waiter about to sleep, whose
    /// submission may not have woken it).
    fn wake(&self);
}
