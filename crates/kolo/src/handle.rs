//! Handles on operations in flight: block with [`Handle::wait`], check with
//! [`Handle::poll`], or `.await` them.
//!
//! Outside a [`crate::Scope`] the engine never touches the caller's
//! buffers: it works on its own copies, and a handle writes results back
//! into the caller's buffer when it is waited on or polled to completion.
//! Forgetting a handle (`std::mem::forget`) or dropping it therefore only
//! discards the result; the operation still runs on every rank. (In a scope
//! the engine works on the lent buffers in place, and the scope, not the
//! handle, keeps them borrowed until the engine is done.)

use crate::error::Error;
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long [`Completion::wait`] yields the CPU while polling before it
/// sleeps on the condition variable. The engine completes the tensors of a
/// fused operation one after another within microseconds: a waiter that
/// slept on each would pay a futex wake-up and a context switch per tensor.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// The engine's result for one tensor: its output buffer, type-erased.
pub(crate) type Payload = Box<dyn Any + Send>;

/// Where the engine leaves the result of one tensor's operation.
pub(crate) struct Completion {
    state: Mutex<State>,
    done: Condvar,
    /// Set (after `state`) once done: lets waiters poll without the lock.
    finished: AtomicBool,
}

enum State {
    Pending(Option<Waker>),
    Done(Result<Payload, Error>),
    Taken,
}

impl Completion {
    /// A completion still pending.
    pub(crate) fn new() -> Arc<Completion> {
        Arc::new(Completion {
            state: Mutex::new(State::Pending(None)),
            done: Condvar::new(),
            finished: AtomicBool::new(false),
        })
    }

    /// Completes with `result`; a completion already done keeps its first
    /// result.
    pub(crate) fn complete(&self, result: Result<Payload, Error>) {
        let waker = {
            let mut state = self.state.lock();
            let State::Pending(waker) = &mut *state else {
                return;
            };
            let waker = waker.take();
            *state = State::Done(result);
            self.finished.store(true, Ordering::Release);
            waker
        };
        self.done.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn is_done(&self) -> bool {
        !matches!(*self.state.lock(), State::Pending(_))
    }

    /// Blocks until done and takes the result: polls (yielding the CPU)
    /// for [`POLL_BEFORE_SLEEP`], then sleeps on the condition variable.
    fn wait(&self) -> Option<Result<Payload, Error>> {
        let start = Instant::now();
        while !self.finished.load(Ordering::Acquire) && start.elapsed() < POLL_BEFORE_SLEEP {
            std::thread::yield_now();
        }
        let mut state = self.state.lock();
        while matches!(*state, State::Pending(_)) {
            self.done.wait(&mut state);
        }
        take(&mut state)
    }

    /// Takes the result if done; otherwise remembers `waker` (if any).
    fn try_take(&self, waker: Option<&Waker>) -> Option<Result<Payload, Error>> {
        let mut state = self.state.lock();
        if let State::Pending(slot) = &mut *state {
            if let Some(waker) = waker {
                *slot = Some(waker.clone());
            }
            return None;
        }
        take(&mut state)
    }
}

/// Takes a done result out of `state`, leaving `Taken`.
fn take(state: &mut State) -> Option<Result<Payload, Error>> {
    match std::mem::replace(state, State::Taken) {
        State::Done(result) => Some(result),
        other => {
            *state = other;
            None
        }
    }
}

/// Turns the payloads of every tensor of a handle into its output (copying
/// results into the caller's buffers).
type Finish<'a, O> = Box<dyn FnOnce(Vec<Payload>) -> Result<O, Error> + Send + 'a>;

/// One tensor of a handle.
struct Part {
    tensor: String,
    completion: Arc<Completion>,
    result: Option<Result<Payload, Error>>,
}

/// An operation in flight, borrowing the caller's output buffer (if any)
/// for `'a`.
///
/// The operation runs whether or not the handle is kept: dropping (or
/// forgetting) it discards the result, never the operation. The result is
/// written into the caller's buffer by [`Handle::wait`], by [`Handle::poll`]
/// once it returns `Some`, or by `.await`. On failure the buffer is left
/// untouched.
#[must_use = "an operation's result (and error) is only seen through its handle"]
pub struct Handle<'a, O> {
    parts: Vec<Part>,
    finish: Option<Finish<'a, O>>,
}

impl<'a, O> Handle<'a, O> {
    /// A handle over the completions of `parts` (tensor name, completion);
    /// `finish` turns their payloads, in order, into the output.
    pub(crate) fn new(
        parts: Vec<(String, Arc<Completion>)>,
        finish: impl FnOnce(Vec<Payload>) -> Result<O, Error> + Send + 'a,
    ) -> Self {
        Handle {
            parts: parts
                .into_iter()
                .map(|(tensor, completion)| Part {
                    tensor,
                    completion,
                    result: None,
                })
                .collect(),
            finish: Some(Box::new(finish)),
        }
    }

    /// The names of the tensors the handle waits for.
    pub fn tensors(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().map(|p| p.tensor.as_str())
    }

    /// True once every tensor's operation completed (then [`Handle::wait`]
    /// returns at once).
    pub fn is_complete(&self) -> bool {
        self.parts
            .iter()
            .all(|p| p.result.is_some() || p.completion.is_done())
    }

    /// The result if the operation completed (written into the caller's
    /// buffer now), `None` while it is in flight. After it returned `Some`,
    /// the handle is spent: a further call returns an error.
    pub fn poll(&mut self) -> Option<Result<O, Error>> {
        self.advance(|c| c.try_take(None))
    }

    /// Blocks until the operation completed and returns its result, written
    /// into the caller's buffer.
    pub fn wait(mut self) -> Result<O, Error> {
        let first = self
            .parts
            .first()
            .map(|p| p.tensor.clone())
            .unwrap_or_default();
        self.advance(Completion::wait)
            .unwrap_or_else(|| Err(spent(&first)))
    }

    /// Collects the parts' results with `take`; once all are in, finishes.
    fn advance(
        &mut self,
        mut take: impl FnMut(&Completion) -> Option<Result<Payload, Error>>,
    ) -> Option<Result<O, Error>> {
        if self.finish.is_none() {
            let first = self.parts.first().map_or("", |p| p.tensor.as_str());
            return Some(Err(spent(first)));
        }
        let mut pending = false;
        for part in self.parts.iter_mut().filter(|p| p.result.is_none()) {
            part.result = take(&part.completion);
            pending |= part.result.is_none();
        }
        if pending {
            return None;
        }
        let finish = self.finish.take()?;
        let mut payloads = Vec::with_capacity(self.parts.len());
        for part in &mut self.parts {
            match part.result.take() {
                Some(Ok(payload)) => payloads.push(payload),
                Some(Err(error)) => return Some(Err(error)),
                None => return Some(Err(spent(&part.tensor))),
            }
        }
        Some(finish(payloads))
    }
}

/// The error of a handle whose result was already taken.
fn spent(tensor: &str) -> Error {
    Error::InvalidArgument {
        tensor: tensor.to_owned(),
        reason: "the result of this handle was already taken".into(),
    }
}

impl<O> Future for Handle<'_, O> {
    type Output = Result<O, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let waker = cx.waker();
        match this.advance(|c| c.try_take(Some(waker))) {
            Some(result) => Poll::Ready(result),
            None => Poll::Pending,
        }
    }
}

impl<O> std::fmt::Debug for Handle<'_, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field(
                "tensors",
                &self.parts.iter().map(|p| &p.tensor).collect::<Vec<_>>(),
            )
            .field("complete", &self.is_complete())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle_of(completions: &[Arc<Completion>]) -> Handle<'static, usize> {
        let parts = completions
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("t{i}"), Arc::clone(c)))
            .collect();
        Handle::new(parts, |payloads: Vec<Payload>| Ok(payloads.len()))
    }

    #[test]
    fn poll_then_complete() {
        let (a, b) = (Completion::new(), Completion::new());
        let mut h = handle_of(&[a.clone(), b.clone()]);
        assert!(h.poll().is_none());
        a.complete(Ok(Box::new(1u8)));
        assert!(!h.is_complete());
        assert!(h.poll().is_none());
        b.complete(Ok(Box::new(2u8)));
        assert!(h.is_complete());
        assert_eq!(h.poll(), Some(Ok(2)));
        assert!(matches!(h.poll(), Some(Err(Error::InvalidArgument { .. }))));
    }

    #[test]
    fn the_first_error_wins_and_later_completions_are_ignored() {
        let (a, b) = (Completion::new(), Completion::new());
        let h = handle_of(&[a.clone(), b.clone()]);
        b.complete(Err(Error::ShutDown { by_ranks: vec![1] }));
        b.complete(Ok(Box::new(0u8)));
        a.complete(Ok(Box::new(0u8)));
        assert_eq!(h.wait(), Err(Error::ShutDown { by_ranks: vec![1] }));
    }

    #[test]
    fn wait_blocks_until_another_thread_completes() {
        let a = Completion::new();
        let h = handle_of(std::slice::from_ref(&a));
        let t = std::thread::spawn(move || a.complete(Ok(Box::new(()))));
        assert_eq!(h.wait(), Ok(1));
        t.join().unwrap();
    }

    #[test]
    fn await_completes() {
        let a = Completion::new();
        let h = handle_of(std::slice::from_ref(&a));
        let t = std::thread::spawn(move || a.complete(Ok(Box::new(()))));
        assert_eq!(futures_executor::block_on(h), Ok(1));
        t.join().unwrap();
    }
}
