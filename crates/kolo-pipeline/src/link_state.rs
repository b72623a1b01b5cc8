//! The state one link shares between the caller's threads and whoever
//! moves its messages (a helper thread, or the serial engine's loop): the
//! queue of received tensors by minibatch, the send and ack counts, and the
//! link's failure. Also [`Counter`], the running-helpers count callers
//! wait on, and [`Helpers`], a caller's handle on it.

use crate::error::PipelineError;
use crate::link::Link;
use crate::payload::{check_taken, Payload};
use kolo_transport::MemoryKind;
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Inner {
    /// Send role: messages handed to the mover, and acks received.
    posted: u64,
    acked: u64,
    /// Recv role: messages arrived and taken, acks handed to the mover.
    arrived: u64,
    taken: u64,
    ready: BTreeMap<u64, Payload>,
    /// The serial engine has been asked to receive (a message, an ack).
    fetching: bool,
    failure: Option<PipelineError>,
}

/// One link's shared state.
pub(crate) struct LinkState {
    pub(crate) link: Link,
    inner: Mutex<Inner>,
    cond: Condvar,
}

/// Counts of a link, for completion checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) posted: u64,
    pub(crate) acked: u64,
    pub(crate) arrived: u64,
    pub(crate) taken: u64,
}

impl LinkState {
    pub(crate) fn new(link: Link) -> Self {
        LinkState {
            link,
            inner: Mutex::new(Inner::default()),
            cond: Condvar::new(),
        }
    }

    /// Records the link's first failure and wakes every waiter.
    pub(crate) fn fail(&self, error: PipelineError) {
        let mut inner = self.inner.lock();
        if inner.failure.is_none() {
            inner.failure = Some(error);
        }
        inner.fetching = false;
        self.cond.notify_all();
    }

    pub(crate) fn failure(&self) -> Option<PipelineError> {
        self.inner.lock().failure.clone()
    }

    pub(crate) fn counts(&self) -> Counts {
        let inner = self.inner.lock();
        Counts {
            posted: inner.posted,
            acked: inner.acked,
            arrived: inner.arrived,
            taken: inner.taken,
        }
    }

    /// A received tensor for `minibatch`.
    pub(crate) fn deliver(&self, minibatch: u64, payload: Payload) {
        let mut inner = self.inner.lock();
        inner.ready.insert(minibatch, payload);
        inner.arrived += 1;
        inner.fetching = false;
        self.cond.notify_all();
    }

    /// An ack from the receiver.
    pub(crate) fn acknowledge(&self) {
        let mut inner = self.inner.lock();
        inner.acked += 1;
        inner.fetching = false;
        self.cond.notify_all();
    }

    /// Waits for `minibatch` and takes it, if it arrived in `wanted`
    /// memory (otherwise it stays queued and the error names the call that
    /// takes it). `fetch` asks the serial engine for the link's next
    /// message (the threaded engine prefetches, and passes a no-op); it is
    /// called with the link locked, at most once per message.
    pub(crate) fn take(
        &self,
        minibatch: u64,
        wanted: MemoryKind,
        fetch: impl Fn() -> Result<(), PipelineError>,
    ) -> Result<Payload, PipelineError> {
        let position = self.link.position(minibatch);
        let mut inner = self.inner.lock();
        loop {
            if let Some(arrived) = inner.ready.get(&minibatch).map(Payload::memory) {
                check_taken(&self.link, minibatch, arrived, wanted)?;
            }
            if let Some(payload) = inner.ready.remove(&minibatch) {
                inner.taken += 1;
                return Ok(payload);
            }
            if position.is_some_and(|p| p < inner.arrived) {
                return Err(self.already(minibatch, "received"));
            }
            if let Some(err) = &inner.failure {
                return Err(err.clone());
            }
            if !inner.fetching {
                inner.fetching = true;
                fetch()?;
            }
            self.cond.wait(&mut inner);
        }
    }

    /// Hands `minibatch` to `post` if it is the link's next one and the
    /// forward-only `window` has room (waiting for acks, asking the serial
    /// engine for them with `fetch_ack`).
    pub(crate) fn send(
        &self,
        minibatch: u64,
        window: Option<usize>,
        fetch_ack: impl Fn() -> Result<(), PipelineError>,
        post: impl FnOnce() -> Result<(), PipelineError>,
    ) -> Result<(), PipelineError> {
        let mut inner = self.inner.lock();
        if let Some(err) = &inner.failure {
            return Err(err.clone());
        }
        let due = if inner.posted < self.link.expected {
            self.link.nth(inner.posted)
        } else {
            None
        };
        if due != Some(minibatch) {
            let sent_before = self
                .link
                .position(minibatch)
                .is_some_and(|p| p < inner.posted);
            return Err(match due {
                Some(expected) if !sent_before => PipelineError::OutOfOrder {
                    name: self.link.name.clone(),
                    direction: self.link.direction,
                    peer: self.link.peer,
                    expected,
                    got: minibatch,
                },
                _ => self.already(minibatch, "sent"),
            });
        }
        if let Some(window) = window {
            while inner.posted - inner.acked >= window as u64 {
                if let Some(err) = &inner.failure {
                    return Err(err.clone());
                }
                if !inner.fetching {
                    inner.fetching = true;
                    fetch_ack()?;
                }
                self.cond.wait(&mut inner);
            }
        }
        post()?;
        inner.posted += 1;
        Ok(())
    }

    fn already(&self, minibatch: u64, action: &'static str) -> PipelineError {
        PipelineError::AlreadyDone {
            name: self.link.name.clone(),
            direction: self.link.direction,
            peer: self.link.peer,
            minibatch,
            action,
        }
    }
}

/// How many helper threads are still running; callers wait for zero.
#[derive(Default)]
pub(crate) struct Counter {
    running: Mutex<usize>,
    cond: Condvar,
}

impl Counter {
    pub(crate) fn start(&self) {
        *self.running.lock() += 1;
    }

    pub(crate) fn done(&self) {
        let mut running = self.running.lock();
        *running = running.saturating_sub(1);
        self.cond.notify_all();
    }

    pub(crate) fn running(&self) -> usize {
        *self.running.lock()
    }

    /// Returns once no helper runs.
    pub(crate) fn wait(&self) {
        let mut running = self.running.lock();
        while *running > 0 {
            self.cond.wait(&mut running);
        }
    }

    /// Returns once no helper runs (true) or after `timeout` (false).
    pub(crate) fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut running = self.running.lock();
        while *running > 0 {
            if self.cond.wait_until(&mut running, deadline).timed_out() {
                return *running == 0;
            }
        }
        true
    }
}

/// A handle on a pipeline's helper threads that outlives the
/// [`crate::Pipeline`] (from [`crate::Pipeline::helpers`]).
///
/// After [`crate::Pipeline::abort`] (or a drop) the helpers are not
/// joined: each ends once its peer has sent what it owed or aborted too.
/// A backend that must outlive its communicators' last use — MPI, which a
/// process should finalise only when no helper is inside an MPI call, on
/// the thread that initialised it — waits for them here first, bounded.
#[derive(Clone)]
pub struct Helpers(pub(crate) Arc<Counter>);

impl Helpers {
    /// How many helper threads still run.
    pub fn running(&self) -> usize {
        self.0.running()
    }

    /// Waits until no helper runs, at most `timeout`; true when none does.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.0.wait_timeout(timeout)
    }
}

impl std::fmt::Debug for Helpers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Helpers")
            .field("running", &self.running())
            .finish()
    }
}

/// Calls [`Counter::done`] when dropped, so a helper counts as finished
/// however it ends.
pub(crate) struct Running<'a>(pub(crate) &'a Counter);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.done();
    }
}
