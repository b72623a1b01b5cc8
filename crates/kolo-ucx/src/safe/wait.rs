//! Waiting for UCX requests: the waiting thread progresses the worker
//! (UCX makes progress only inside `ucp_worker_progress`), yields the CPU
//! between idle polls, and gives up on a request whose peer failed (its
//! endpoint's error handler fired): a posted receive is not tied to an
//! endpoint, so without this a receive from a dead process would wait
//! forever. A cancelled request is still completed and freed before the
//! buffer it names is handed back.

use crate::result::{self, Started, UcsError};
use crate::safe::worker::{PeerState, Worker};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Idle polls before a wait starts yielding the CPU, where every process
/// of the host has a core of its own; where they share cores, a wait
/// yields at once, or the spinning ranks keep the one they wait for off
/// the CPU.
pub const SPIN_POLLS: u32 = 256;
/// How long a cancelled request may take to complete.
const CANCEL_BOUND: Duration = Duration::from_secs(5);

/// Why a wait ended without its request completing.
#[derive(Debug)]
pub enum WaitError {
    /// UCX failed the request.
    Ucs(UcsError),
    /// The peer's endpoint failed (the request was cancelled).
    PeerFailed(UcsError),
    /// The deadline passed (the request was cancelled).
    TimedOut,
    /// Another thread interrupted the wait (see [`Interrupter`]), for this
    /// reason (the request was cancelled).
    Interrupted(String),
}

/// Lets another thread end a communicator's waits: kolo's watchdog, when
/// an operation outlived its timeout while a peer stopped answering (a
/// frozen process, a link down: no endpoint error comes). Every wait then
/// fails with [`WaitError::Interrupted`], now and from then on.
#[derive(Clone, Debug, Default)]
pub struct Interrupter(Arc<Interruption>);

#[derive(Debug, Default)]
struct Interruption {
    set: AtomicBool,
    why: Mutex<String>,
}

impl Interrupter {
    /// Ends every wait of the communicator, now and later, with `why`.
    pub fn interrupt(&self, why: &str) {
        if let Ok(mut slot) = self.0.why.lock() {
            if slot.is_empty() {
                *slot = why.to_owned();
            }
        }
        self.0.set.store(true, Ordering::Release);
    }

    /// Why the communicator was interrupted, once it was.
    pub fn reason(&self) -> Option<String> {
        if !self.0.set.load(Ordering::Acquire) {
            return None;
        }
        Some(self.0.why.lock().map(|why| why.clone()).unwrap_or_default())
    }
}

/// One request in flight, and what it is about.
pub struct InFlight {
    request: Option<*mut c_void>,
    receive: bool,
    call: &'static str,
    /// Bytes received (receives).
    pub received: Option<usize>,
}

impl InFlight {
    /// A started operation: done at once (with `len` bytes, for a receive
    /// that completed immediately), or a request to wait for.
    pub fn new(started: Started, receive: bool, len: usize, call: &'static str) -> InFlight {
        match started {
            Started::Done => InFlight {
                request: None,
                receive,
                call,
                received: receive.then_some(len),
            },
            Started::Request(request) => InFlight {
                request: Some(request),
                receive,
                call,
                received: None,
            },
        }
    }

    /// Polls once: `Ok(true)` once complete (and freed).
    fn poll(&mut self) -> Result<bool, UcsError> {
        let Some(request) = self.request else {
            return Ok(true);
        };
        let done = if self.receive {
            // SAFETY: a live receive request of this process.
            unsafe { result::recv_done(request) }.map(|len| {
                self.received = len;
                len.is_some()
            })
        } else {
            // SAFETY: a live request of this process.
            unsafe { result::request_done(request, self.call) }
        };
        match done {
            Ok(false) => Ok(false),
            outcome => {
                // SAFETY: completed (successfully or not): freed once.
                unsafe { result::request_free(request) };
                self.request = None;
                outcome.map(|_| true)
            }
        }
    }

    /// Cancels the request and waits (bounded) for it to complete, so that
    /// UCX no longer touches its buffer, then frees it.
    fn cancel(&mut self, worker: &mut Worker) {
        let Some(request) = self.request.take() else {
            return;
        };
        // SAFETY: a live request of this worker.
        unsafe { result::request_cancel(worker.raw(), request) };
        let deadline = Instant::now() + CANCEL_BOUND;
        loop {
            worker.progress();
            // SAFETY: a live request of this process.
            let done = unsafe { result::request_done(request, self.call) };
            if !matches!(done, Ok(false)) || Instant::now() >= deadline {
                break;
            }
        }
        // SAFETY: completed, or cancelled past its bound: not used again.
        unsafe { result::request_free(request) };
    }
}

/// Waits until every one of `requests` completed, progressing `worker`:
/// the first failure cancels the others. A failure of any of `peers` (the
/// communicator's) ends the wait too: no collective can complete without
/// every rank, and a receive from a live peer that itself waits for the
/// dead one would wait forever. `deadline` bounds the wait, and
/// `interrupter`, once used, ends it.
pub fn wait_all(
    worker: &mut Worker,
    requests: &mut [InFlight],
    peers: &[Arc<PeerState>],
    deadline: Option<Instant>,
    interrupter: Option<&Interrupter>,
    spin_polls: u32,
) -> Result<(), WaitError> {
    let mut idle = 0u32;
    loop {
        let events = worker.progress();
        let mut pending = false;
        for request in requests.iter_mut() {
            match request.poll() {
                Ok(true) => {}
                Ok(false) => pending = true,
                Err(e) => {
                    cancel_all(worker, requests);
                    let peer_failed = peers.iter().any(|p| p.failure().is_some());
                    return Err(if e.is_peer_failure() || peer_failed {
                        WaitError::PeerFailed(e)
                    } else {
                        WaitError::Ucs(e)
                    });
                }
            }
        }
        if !pending {
            return Ok(());
        }
        if let Some(failure) = peers.iter().find_map(|p| p.failure()) {
            cancel_all(worker, requests);
            return Err(WaitError::PeerFailed(failure));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            cancel_all(worker, requests);
            return Err(WaitError::TimedOut);
        }
        if let Some(why) = interrupter.and_then(Interrupter::reason) {
            cancel_all(worker, requests);
            return Err(WaitError::Interrupted(why));
        }
        if events == 0 {
            idle += 1;
            if idle > spin_polls {
                std::thread::yield_now();
            }
        } else {
            idle = 0;
        }
    }
}

fn cancel_all(worker: &mut Worker, requests: &mut [InFlight]) {
    for request in requests.iter_mut() {
        request.cancel(worker);
    }
}
