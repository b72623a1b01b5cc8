//! A caller waiting for its own results runs the engine's cycles itself.
//!
//! A rank's engine state ([`Core`](crate::background::Core)) sits behind
//! a lock that the background thread takes only to run a cycle. A handle's
//! waiter whose engine is free takes the lock and runs the cycles on its
//! own thread until its results are in, as an MPI library progresses
//! inside the call that waits. Its step then runs where its buffers were
//! just written (in that core's cache), and neither the hand-over to the
//! background thread nor the wake-up back costs anything. The background thread keeps every other
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

use crate::background::{Command, Shareable};
use crate::device::NoPlane;
use crate::error::Error;
use crate::panic_text::panic_text;
use kolo_transport::Backend;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
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

impl<B: Backend + Send + 'static> Progress for Shareable<B, NoPlane> {
    fn run_until(&self, done: &dyn Fn() -> bool, deadline: Instant) -> bool {
        let Some(mut core) = self.core.try_lock() else {
            return false;
        };
        while !core.is_stopped() && !done() && Instant::now() < deadline && core.has_work() {
            match catch_unwind(AssertUnwindSafe(|| core.step())) {
                Ok(Ok(())) => core.count_caller_cycle(),
                Ok(Err(reason)) => core.stop(reason),
                Err(panic) => {
                    let rank = core.rank();
                    core.stop(Error::RankFailed {
                        rank,
                        message: format!(
                            "kolo's engine panicked on a caller's thread: {}",
                            panic_text(panic.as_ref())
                        ),
                    });
                    drop(core);
                    resume_unwind(panic);
                }
            }
        }
        let left = !core.is_stopped() && core.has_work();
        drop(core);
        if left {
            self.wake();
        }
        true
    }

    fn wake(&self) {
        // A closed channel means the background thread has stopped.
        let _ = self.wake.send(Command::Wake);
    }
}
