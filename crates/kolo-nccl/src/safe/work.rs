//! [`Work`]: the handle of one enqueued operation, completed by the
//! device's completion thread; and [`Health`], the communicator's
//! broken-or-not flag shared by its owner and that thread.

use crate::error::NcclError;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Callback = Box<dyn FnOnce(Result<(), NcclError>) + Send>;

#[derive(Default)]
struct State {
    outcome: Option<Result<(), NcclError>>,
    callbacks: Vec<Callback>,
}

/// Shared between a [`Work`] and the completion thread.
#[derive(Default)]
pub(crate) struct WorkState {
    state: Mutex<State>,
    done: Condvar,
    /// Set (after `state` holds the outcome) when completed: a waiter
    /// spins on it before sleeping on `done`.
    finished: AtomicBool,
}

/// How long [`Work::wait`] spins on the outcome before it sleeps: a short
/// operation completes within it, and waking a sleeping thread costs
/// microseconds on a virtual machine.
const WAIT_SPIN: Duration = Duration::from_micros(50);

impl WorkState {
    /// Spins until completed or `bound` has passed; true if completed.
    fn spin(&self, bound: Duration) -> bool {
        let until = Instant::now() + bound;
        loop {
            if self.finished.load(Ordering::Acquire) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::hint::spin_loop();
        }
    }
}

impl WorkState {
    /// Records the outcome (the first one wins), wakes waiters and runs the
    /// callbacks on this thread.
    pub(crate) fn complete(&self, outcome: Result<(), NcclError>) {
        let callbacks = {
            let mut state = self.state.lock();
            if state.outcome.is_some() {
                return;
            }
            state.outcome = Some(outcome.clone());
            self.finished.store(true, Ordering::Release);
            std::mem::take(&mut state.callbacks)
        };
        self.done.notify_all();
        for callback in callbacks {
            callback(outcome.clone());
        }
    }
}

/// The handle of an operation enqueued on a communicator's stream. The
/// GPU runs it asynchronously; the device's completion thread notices its
/// done event and completes the handle, with an error if NCCL reported an
/// asynchronous failure, the operation outlived the communicator's
/// operation timeout, or the communicator was shut down first.
///
/// Later GPU work does not need the handle: buffers written by the
/// operation carry cudarc's write events, which any stream using them
/// waits for ([`crate::Untracked`] buffers excepted: order them with
/// [`NcclComm::join_into`](crate::NcclComm::join_into) or the handle).
#[derive(Clone)]
pub struct Work {
    state: Arc<WorkState>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("outcome", &self.state.state.lock().outcome)
            .finish()
    }
}

impl Work {
    /// A pending handle and the state the completion thread completes.
    pub(crate) fn pending() -> (Work, Arc<WorkState>) {
        let state = Arc::new(WorkState::default());
        (
            Work {
                state: state.clone(),
            },
            state,
        )
    }

    /// A handle that is already complete.
    #[cfg(test)]
    pub(crate) fn completed(outcome: Result<(), NcclError>) -> Work {
        let (work, state) = Work::pending();
        state.complete(outcome);
        work
    }

    /// The outcome, if the operation has completed (never blocks).
    pub fn poll(&self) -> Option<Result<(), NcclError>> {
        self.state.state.lock().outcome.clone()
    }

    /// True once completed (successfully or not).
    pub fn is_done(&self) -> bool {
        self.state.finished.load(Ordering::Acquire)
    }

    /// Blocks until completed. Terminates: the completion thread fails the
    /// handle after the communicator's operation timeout.
    pub fn wait(&self) -> Result<(), NcclError> {
        self.state.spin(WAIT_SPIN);
        let mut state = self.state.state.lock();
        loop {
            if let Some(outcome) = &state.outcome {
                return outcome.clone();
            }
            self.state.done.wait(&mut state);
        }
    }

    /// Blocks at most `timeout`; [`NcclError::Timeout`] if still pending
    /// (the operation itself continues).
    pub fn wait_timeout(&self, timeout: Duration) -> Result<(), NcclError> {
        let deadline = Instant::now() + timeout;
        self.state.spin(WAIT_SPIN.min(timeout));
        let mut state = self.state.state.lock();
        loop {
            if let Some(outcome) = &state.outcome {
                return outcome.clone();
            }
            if self.state.done.wait_until(&mut state, deadline).timed_out()
                && state.outcome.is_none()
            {
                return Err(NcclError::Timeout {
                    what: "an NCCL operation".into(),
                    seconds: timeout.as_secs_f64(),
                });
            }
        }
    }

    /// Runs `callback` with the outcome once completed: on the completion
    /// thread, or right here if already complete. Keep it short; it delays
    /// the completion of later operations.
    pub fn on_complete(&self, callback: impl FnOnce(Result<(), NcclError>) + Send + 'static) {
        let mut state = self.state.state.lock();
        match state.outcome.clone() {
            Some(outcome) => {
                drop(state);
                callback(outcome);
            }
            None => state.callbacks.push(Box::new(callback)),
        }
    }
}

/// Whether a communicator is still usable, and the first failure if not.
#[derive(Debug)]
pub(crate) struct Health {
    rank: usize,
    broken: AtomicBool,
    cause: Mutex<Option<NcclError>>,
    /// Set once the completion thread's watchdog aborted the communicator.
    aborted: AtomicBool,
}

impl Health {
    pub(crate) fn new(rank: usize) -> Self {
        Health {
            rank,
            broken: AtomicBool::new(false),
            cause: Mutex::new(None),
            aborted: AtomicBool::new(false),
        }
    }

    /// Records that the watchdog aborted the communicator (it is broken
    /// already): later errors say so.
    pub(crate) fn note_aborted(&self) {
        self.aborted.store(true, Ordering::Release);
    }

    /// Marks the communicator broken by `cause` (the first cause is kept).
    pub(crate) fn fail(&self, cause: &NcclError) {
        let mut first = self.cause.lock();
        if first.is_none() {
            *first = Some(cause.clone());
        }
        self.broken.store(true, Ordering::Release);
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// `Ok` while healthy, else [`NcclError::Broken`] naming the first cause.
    pub(crate) fn check(&self) -> Result<(), NcclError> {
        if !self.is_broken() {
            return Ok(());
        }
        Err(self.broken_error())
    }

    pub(crate) fn broken_error(&self) -> NcclError {
        let cause = self
            .cause
            .lock()
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_else(|| "unknown".into());
        let cause = if self.aborted.load(Ordering::Acquire) {
            format!("{cause}; the watchdog aborted it (ncclCommAbort)")
        } else {
            cause
        };
        NcclError::Broken {
            rank: self.rank,
            cause,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn completes_once_and_wakes_waiters() {
        let (work, state) = Work::pending();
        assert!(work.poll().is_none());
        let waiter = {
            let work = work.clone();
            std::thread::spawn(move || work.wait())
        };
        state.complete(Ok(()));
        state.complete(Err(NcclError::ShutDown));
        assert_eq!(waiter.join().unwrap(), Ok(()));
        assert_eq!(work.poll(), Some(Ok(())));
    }

    #[test]
    fn wait_timeout_reports_a_timeout_while_pending() {
        let (work, _state) = Work::pending();
        let err = work.wait_timeout(Duration::from_millis(5)).unwrap_err();
        assert!(matches!(err, NcclError::Timeout { .. }));
        assert!(!work.is_done());
    }

    #[test]
    fn callbacks_run_once_whenever_registered() {
        let calls = Arc::new(AtomicUsize::new(0));
        let (work, state) = Work::pending();
        let c = calls.clone();
        work.on_complete(move |r| {
            assert_eq!(r, Err(NcclError::ShutDown));
            c.fetch_add(1, Ordering::SeqCst);
        });
        state.complete(Err(NcclError::ShutDown));
        let c = calls.clone();
        work.on_complete(move |_| {
            c.fetch_add(10, Ordering::SeqCst);
        });
        assert_eq!(calls.load(Ordering::SeqCst), 11);
        assert_eq!(Work::completed(Ok(())).wait(), Ok(()));
    }

    #[test]
    fn health_keeps_the_first_cause() {
        let health = Health::new(3);
        assert_eq!(health.check(), Ok(()));
        health.fail(&NcclError::ShutDown);
        health.fail(&NcclError::InvalidArgument("later".into()));
        let err = health.check().unwrap_err();
        assert!(
            matches!(&err, NcclError::Broken { rank: 3, cause } if cause.contains("shut down")),
            "{err}"
        );
    }
}
