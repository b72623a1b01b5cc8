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
//!
//! One submission — a single tensor or a group — has one [`Completion`]:
//! the engine completes the submission's tensors ([`Part`]s) one by one or
//! a fused run at a time, and the submission is done, its waiter woken
//! once, when the last part is in.

use crate::error::Error;
use crate::lease::Lease;
use crate::progress::Progress;
use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long [`Completion::wait`] yields the CPU while polling before it
/// sleeps on the condition variable: the engine completes a step's tensors
/// within microseconds of each other, and sleeping would cost a futex
/// wake-up and a context switch.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(500);

/// The engine's result for one tensor: its output buffer, type-erased.
pub(crate) type Payload = Box<dyn Any + Send>;

/// Where the engine leaves the results of one submission's tensors.
pub(crate) struct Completion {
    /// The submission's tensors, in part order.
    names: Arc<TensorNames>,
    state: Mutex<State>,
    done: Condvar,
    /// Set (after `state`) once every part is in: lets waiters poll
    /// without the lock. On a line of its own, away from the lock and the
    /// reference count that the engine's thread writes.
    finished: CachePadded<AtomicBool>,
    /// Runs the engine's cycles on the waiting thread, on a host engine
    /// (see [`crate::progress`]).
    progress: Option<Weak<dyn Progress>>,
}

struct State {
    /// Parts not completed yet.
    remaining: usize,
    /// Which parts are in (consulted only while the submission is not
    /// done: is a name of it still in flight?).
    done: Vec<bool>,
    /// Each part's output, when the submission returns outputs (empty
    /// otherwise: a lent allreduce returns nothing).
    payloads: Vec<Option<Payload>>,
    /// The error of the lowest-numbered failed part.
    error: Option<(u32, Error)>,
    /// Every failed part (the others delivered their results).
    failed: Vec<u32>,
    waker: Option<Waker>,
    /// Held until every part is in: the claim of a scope on the caller's
    /// memory, released only after the engine's last access to it.
    lease: Option<Lease>,
    /// The results were handed out.
    taken: bool,
    /// The engine's staging copy of the inputs (a copying group's), whose
    /// memory the engine works on lent: handed to the waiter after the
    /// outputs, never before every part is in.
    staging: Option<Payload>,
}

/// What a done submission delivered: every part's output (in order, the
/// staging copy after them), or what failed.
pub(crate) type Outcome = Result<Vec<Payload>, Failure>;

/// A done submission of which some parts failed.
pub(crate) struct Failure {
    /// The error of the lowest-numbered failed part.
    pub(crate) error: Error,
    /// Which parts failed, ascending; the others were performed.
    pub(crate) failed: Vec<u32>,
    /// The engine's staging copy of the inputs, if the submission had one:
    /// the performed parts' results are in it.
    pub(crate) staging: Option<Payload>,
}

impl Completion {
    /// A submission of the tensors `names` (one part each), pending;
    /// `payloads` says whether the parts deliver outputs. `lease` is
    /// released once every part is in (at once for no parts). A waiter
    /// runs the engine's cycles through `progress` while it can.
    pub(crate) fn new(
        names: Arc<TensorNames>,
        payloads: bool,
        lease: Option<Lease>,
        progress: Option<Weak<dyn Progress>>,
    ) -> Arc<Completion> {
        let parts = names.len();
        let completion = Arc::new(Completion {
            names,
            state: Mutex::new(State {
                remaining: parts,
                done: vec![false; parts],
                payloads: if payloads {
                    (0..parts).map(|_| None).collect()
                } else {
                    Vec::new()
                },
                error: None,
                failed: Vec::new(),
                waker: None,
                lease,
                taken: false,
                staging: None,
            }),
            done: Condvar::new(),
            finished: CachePadded::new(AtomicBool::new(false)),
            progress,
        });
        if parts == 0 {
            completion.finish(&mut completion.state.lock());
        }
        completion
    }

    /// Keeps `staging` (memory the submission's tensors are lent from)
    /// until the results are taken: the waiter gets it after the outputs.
    /// Set before the submission is queued.
    pub(crate) fn keep_staging(&self, staging: Payload) {
        self.state.lock().staging = Some(staging);
    }

    /// The part `index` of this submission, for the engine.
    pub(crate) fn part(self: &Arc<Self>, index: usize) -> Part {
        Part {
            completion: Some(Arc::clone(self)),
            index: index as u32,
        }
    }

    /// The names of the submission's tensors.
    pub(crate) fn names(&self) -> &Arc<TensorNames> {
        &self.names
    }

    /// True once part `index` is in (or out of range).
    pub(crate) fn part_done(&self, index: u32) -> bool {
        self.is_done()
            || self
                .state
                .lock()
                .done
                .get(index as usize)
                .copied()
                .unwrap_or(true)
    }

    /// Records one part's result (under the lock).
    fn record(state: &mut State, index: u32, result: Result<Payload, Error>) {
        if state.remaining == 0 {
            // Every part is in (perhaps without its flag, see
            // `complete_all_ok`): the first results stay.
            return;
        }
        match state.done.get_mut(index as usize) {
            Some(done) if !*done => *done = true,
            // Counted in already (or never a part): the first result stays.
            _ => return,
        }
        match result {
            Ok(payload) => {
                if let Some(slot) = state.payloads.get_mut(index as usize) {
                    *slot = Some(payload);
                }
            }
            Err(error) => {
                state.failed.push(index);
                if state.error.as_ref().is_none_or(|(at, _)| index < *at) {
                    state.error = Some((index, error));
                }
            }
        }
        state.remaining = state.remaining.saturating_sub(1);
    }

    /// Marks the submission done once the last part is in: releases the
    /// lease, sets `finished` and wakes the waiters.
    fn finish(&self, state: &mut State) {
        if state.remaining > 0 || self.finished.load(Ordering::Relaxed) {
            return;
        }
        drop(state.lease.take());
        self.finished.store(true, Ordering::Release);
        self.done.notify_all();
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
    }

    /// Completes the parts `index` of this submission with their results
    /// (a part already in keeps its first result).
    pub(crate) fn complete_parts(
        &self,
        parts: impl IntoIterator<Item = (u32, Result<Payload, Error>)>,
    ) {
        let mut state = self.state.lock();
        for (index, result) in parts {
            Completion::record(&mut state, index, result);
        }
        self.finish(&mut state);
    }

    /// Completes the parts `indices` successfully with no output (lent
    /// tensors): one lock, no result per part.
    pub(crate) fn complete_ok(&self, indices: impl IntoIterator<Item = u32>) {
        let mut state = self.state.lock();
        let mut counted = 0;
        for index in indices {
            if let Some(done) = state.done.get_mut(index as usize) {
                counted += usize::from(!std::mem::replace(done, true));
            }
        }
        state.remaining = state.remaining.saturating_sub(counted);
        self.finish(&mut state);
    }

    /// Completes every part successfully with no output (a whole
    /// submission of lent tensors): one lock and no flag per part, as a
    /// done submission reads as done whole (see [`Completion::part_done`]).
    pub(crate) fn complete_all_ok(&self) {
        let mut state = self.state.lock();
        state.remaining = 0;
        self.finish(&mut state);
    }

    /// Fails every part not in yet with `error(its tensor's name)`.
    pub(crate) fn fail_open(&self, error: impl Fn(&str) -> Error) {
        let mut state = self.state.lock();
        let open: Vec<u32> = (0..state.done.len() as u32)
            .filter(|&i| !state.done[i as usize])
            .collect();
        for index in open {
            let failure = error(self.names.get(index as usize));
            Completion::record(&mut state, index, Err(failure));
        }
        self.finish(&mut state);
    }

    /// True once every part is in.
    pub(crate) fn is_done(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Blocks until done and takes the results: for up to
    /// [`POLL_BEFORE_SLEEP`] runs the engine's cycles on this thread while
    /// no other thread does (a host engine, see [`crate::progress`]) or
    /// polls, yielding the CPU; then makes sure the background thread is
    /// awake and sleeps on the condition variable.
    fn wait(&self) -> Option<Outcome> {
        let deadline = Instant::now() + POLL_BEFORE_SLEEP;
        let progress = self.progress.as_ref().and_then(Weak::upgrade);
        while !self.is_done() && Instant::now() < deadline {
            let ran = progress
                .as_ref()
                .is_some_and(|p| p.run_until(&|| self.is_done(), deadline));
            if !ran {
                std::thread::yield_now();
            }
        }
        if let Some(progress) = progress.filter(|_| !self.is_done()) {
            progress.wake();
        }
        let mut state = self.state.lock();
        while !self.finished.load(Ordering::Acquire) {
            self.done.wait(&mut state);
        }
        take(&mut state)
    }

    /// Takes the results if done; otherwise remembers `waker` (if any).
    fn try_take(&self, waker: Option<&Waker>) -> Option<Outcome> {
        let mut state = self.state.lock();
        if !self.finished.load(Ordering::Acquire) {
            if let Some(waker) = waker {
                state.waker = Some(waker.clone());
            }
            return None;
        }
        take(&mut state)
    }
}

/// Takes a done submission's results out of `state`, once.
fn take(state: &mut State) -> Option<Outcome> {
    if std::mem::replace(&mut state.taken, true) {
        return None;
    }
    if let Some((_, error)) = state.error.take() {
        let mut failed = std::mem::take(&mut state.failed);
        failed.sort_unstable();
        return Some(Err(Failure {
            error,
            failed,
            staging: state.staging.take(),
        }));
    }
    let mut outputs: Vec<Payload> = std::mem::take(&mut state.payloads)
        .into_iter()
        .map(|p| p.unwrap_or_else(|| Box::new(())))
        .collect();
    outputs.extend(state.staging.take());
    Some(Ok(outputs))
}

/// One tensor of a submission, as the engine holds it: completing it (or
/// dropping it, which fails it) counts it in.
pub(crate) struct Part {
    completion: Option<Arc<Completion>>,
    index: u32,
}

impl Part {
    /// Completes this tensor with `result`.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn complete(mut self, result: Result<Payload, Error>) {
        if let Some(completion) = self.completion.take() {
            completion.complete_parts([(self.index, result)]);
        }
    }
}

impl Drop for Part {
    /// A part dropped unperformed (the engine unwound, or a kolo bug) fails
    /// its tensor instead of leaving the waiter — or a scope — waiting.
    fn drop(&mut self) {
        if let Some(completion) = self.completion.take() {
            let tensor = completion.names.get(self.index as usize).to_owned();
            completion.complete_parts([(
                self.index,
                Err(Error::Collective {
                    tensor,
                    message: "internal: the engine dropped the tensor without performing it".into(),
                }),
            )]);
        }
    }
}

/// The names of a handle's tensors, in one buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TensorNames {
    text: String,
    ends: Vec<u32>,
}

impl TensorNames {
    /// Room for `tensors` names.
    pub(crate) fn with_capacity(tensors: usize) -> Self {
        TensorNames {
            text: String::with_capacity(tensors * 8),
            ends: Vec::with_capacity(tensors),
        }
    }

    /// Appends `name`.
    pub(crate) fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len() as u32);
    }

    /// The names, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        let mut start = 0usize;
        self.ends.iter().map(move |&end| {
            let name = self.text.get(start..end as usize).unwrap_or("");
            start = end as usize;
            name
        })
    }

    /// The first name ("" for none).
    pub(crate) fn first(&self) -> &str {
        self.get(0)
    }

    /// Name `index` ("" when out of range).
    pub(crate) fn get(&self, index: usize) -> &str {
        let start = match index.checked_sub(1) {
            None => 0,
            Some(before) => self.ends.get(before).map_or(usize::MAX, |&e| e as usize),
        };
        self.ends
            .get(index)
            .and_then(|&end| self.text.get(start..end as usize))
            .unwrap_or("")
    }

    /// Number of names.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when these are exactly `names`, in order.
    pub(crate) fn matches(&self, names: &[&str]) -> bool {
        if names.len() != self.ends.len() {
            return false;
        }
        let text = self.text.as_bytes();
        let mut start = 0usize;
        for (name, &end) in names.iter().zip(&self.ends) {
            let end = end as usize;
            let Some(have) = text.get(start..end) else {
                return false;
            };
            let name = name.as_bytes();
            if have.len() != name.len() || !same_bytes(have, name) {
                return false;
            }
            start = end;
        }
        true
    }
}

/// `a == b` for slices of equal length, in a few word loads: names are
/// short, and a call to `memcmp` per name (a training step checks every
/// name of a repeated group) costs more than the comparison. Two
/// overlapping loads cover a name of up to twice the word size; longer
/// ones go word by word.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    fn word(s: &[u8], at: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_ne_bytes(w)
    }
    fn half(s: &[u8], at: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&s[at..at + 4]);
        u32::from_ne_bytes(w)
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        // Bytes 0, n/2 and n-1 are every byte.
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => {
            let whole = (0..n / 8).all(|k| word(a, 8 * k) == word(b, 8 * k));
            whole && word(a, n - 8) == word(b, n - 8)
        }
    }
}

/// Turns what a handle's submission delivered into its output (copying
/// results into the caller's buffers).
type Finish<'a, O> = Box<dyn FnOnce(Outcome) -> Result<O, Error> + Send + 'a>;

/// An operation in flight, borrowing the caller's output buffer (if any)
/// for `'a`.
///
/// The operation runs whether or not the handle is kept: dropping (or
/// forgetting) it discards the result, never the operation. The result is
/// written into the caller's buffer by [`Handle::wait`], by [`Handle::poll`]
/// once it returns `Some`, or by `.await`. A tensor that failed is left
/// untouched; the other tensors of a group are written (see
/// [`crate::Kolo::grouped_allreduce`] for the rule every call follows).
#[must_use = "an operation's result (and error) is only seen through its handle"]
pub struct Handle<'a, O> {
    completion: Arc<Completion>,
    finish: Option<Finish<'a, O>>,
}

impl<'a, O> Handle<'a, O> {
    /// A handle over the submission `completion`; `finish` turns its
    /// payloads, in order, into the output. If a part fails, the handle
    /// fails with its error and `finish` is not called.
    pub(crate) fn new(
        completion: Arc<Completion>,
        finish: impl FnOnce(Vec<Payload>) -> Result<O, Error> + Send + 'a,
    ) -> Self {
        Handle::delivering(completion, move |outcome| match outcome {
            Ok(payloads) => finish(payloads),
            Err(failure) => Err(failure.error),
        })
    }

    /// A handle over the submission `completion` whose `finish` also sees
    /// a partial failure (to deliver the parts that were performed).
    pub(crate) fn delivering(
        completion: Arc<Completion>,
        finish: impl FnOnce(Outcome) -> Result<O, Error> + Send + 'a,
    ) -> Self {
        Handle {
            completion,
            finish: Some(Box::new(finish)),
        }
    }

    /// The names of the tensors the handle waits for.
    pub fn tensors(&self) -> impl Iterator<Item = &str> {
        self.completion.names.iter()
    }

    /// True once every tensor's operation completed (then [`Handle::wait`]
    /// returns at once).
    pub fn is_complete(&self) -> bool {
        self.completion.is_done()
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
        self.advance(Completion::wait)
            .unwrap_or_else(|| Err(spent(self.completion.names.first())))
    }

    /// Takes the results with `take`; once they are in, finishes.
    fn advance(
        &mut self,
        take: impl FnOnce(&Completion) -> Option<Outcome>,
    ) -> Option<Result<O, Error>> {
        if self.finish.is_none() {
            return Some(Err(spent(self.completion.names.first())));
        }
        let outcome = take(&self.completion)?;
        let finish = self.finish.take()?;
        Some(finish(outcome))
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
        let names = &self.completion.names;
        let mut shown: Vec<&str> = names.iter().take(8).collect();
        let more = format!("... {} tensors", names.len());
        if names.len() > 8 {
            shown.push(&more);
        }
        f.debug_struct("Handle")
            .field("tensors", &shown)
            .field("complete", &self.is_complete())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn same_bytes_is_slice_equality(
            a in prop::collection::vec(any::<u8>(), 0..40),
            flip in any::<prop::sample::Index>(),
            bit in 0u8..8,
            differ: bool,
        ) {
            let mut b = a.clone();
            if differ && !b.is_empty() {
                let at = flip.index(b.len());
                b[at] ^= 1 << bit;
            }
            prop_assert_eq!(same_bytes(&a, &b), a == b);
            prop_assert!(same_bytes(&a, &a));
            prop_assert!(!same_bytes(&a, &[&a[..], b"x"].concat()));
        }
    }

    fn names(n: usize) -> Arc<TensorNames> {
        let mut names = TensorNames::with_capacity(n);
        for i in 0..n {
            names.push(&format!("t{i}"));
        }
        assert!(names.matches(
            &(0..n)
                .map(|i| format!("t{i}"))
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
        ));
        assert!(n == 0 || !names.matches(&["x"; 1]));
        Arc::new(names)
    }

    fn handle_of(completion: &Arc<Completion>) -> Handle<'static, usize> {
        Handle::new(Arc::clone(completion), |payloads: Vec<Payload>| {
            Ok(payloads.len())
        })
    }

    #[test]
    fn poll_then_complete() {
        let c = Completion::new(names(2), true, None, None);
        let mut h = handle_of(&c);
        let (a, b) = (c.part(0), c.part(1));
        assert!(h.poll().is_none());
        a.complete(Ok(Box::new(1u8)));
        assert!(!h.is_complete());
        assert!(h.poll().is_none());
        b.complete(Ok(Box::new(2u8)));
        assert!(h.is_complete());
        assert_eq!(h.poll(), Some(Ok(2)));
        assert!(matches!(h.poll(), Some(Err(Error::InvalidArgument { .. }))));
        assert_eq!(h.tensors().collect::<Vec<_>>(), ["t0", "t1"]);
    }

    #[test]
    fn a_submission_completed_whole_keeps_its_success() {
        let c = Completion::new(names(3), false, None, None);
        let h = handle_of(&c);
        c.complete_all_ok();
        assert!(c.is_done() && (0..3).all(|i| c.part_done(i)));
        // Late results (a kolo bug) change nothing.
        c.fail_open(|_| Error::ShutDown { by_ranks: vec![0] });
        c.complete_parts([(1, Err(Error::ShutDown { by_ranks: vec![1] }))]);
        c.part(2)
            .complete(Err(Error::ShutDown { by_ranks: vec![2] }));
        assert_eq!(h.wait(), Ok(0));
    }

    #[test]
    fn the_lowest_failed_part_wins() {
        let c = Completion::new(names(3), false, None, None);
        let h = handle_of(&c);
        c.part(2)
            .complete(Err(Error::ShutDown { by_ranks: vec![2] }));
        c.part(1)
            .complete(Err(Error::ShutDown { by_ranks: vec![1] }));
        c.part(0).complete(Ok(Box::new(0u8)));
        assert_eq!(h.wait(), Err(Error::ShutDown { by_ranks: vec![1] }));
    }

    #[test]
    fn a_partial_failure_names_the_failed_parts_and_keeps_the_staging() {
        let c = Completion::new(names(3), false, None, None);
        c.keep_staging(Box::new(vec![7u8; 3]));
        let h = Handle::delivering(Arc::clone(&c), |outcome| match outcome {
            Ok(_) => Ok((Vec::new(), None)),
            Err(f) => Ok((
                f.failed,
                f.staging.and_then(|s| s.downcast::<Vec<u8>>().ok()),
            )),
        });
        c.part(2)
            .complete(Err(Error::ShutDown { by_ranks: vec![2] }));
        c.part(0).complete(Ok(Box::new(())));
        c.part(1)
            .complete(Err(Error::ShutDown { by_ranks: vec![1] }));
        let (failed, staging) = h.wait().unwrap();
        assert_eq!(failed, [1, 2]);
        assert_eq!(staging.as_deref(), Some(&vec![7u8; 3]));
    }

    #[test]
    fn a_dropped_part_fails_the_handle() {
        let c = Completion::new(names(1), false, None, None);
        let h = handle_of(&c);
        drop(c.part(0));
        match h.wait() {
            Err(Error::Collective { tensor, .. }) => assert_eq!(tensor, "t0"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_parts_is_done_at_once_and_releases_its_lease() {
        let leases = Arc::new(crate::lease::Leases::default());
        let c = Completion::new(names(0), false, Some(leases.lease()), None);
        assert!(c.is_done());
        leases.wait_all();
        let d = Completion::new(names(1), false, Some(leases.lease()), None);
        d.fail_open(|_| Error::ShutDown { by_ranks: vec![0] });
        leases.wait_all();
    }

    #[test]
    fn wait_blocks_until_another_thread_completes() {
        let c = Completion::new(names(1), false, None, None);
        let h = handle_of(&c);
        let part = c.part(0);
        let t = std::thread::spawn(move || part.complete(Ok(Box::new(()))));
        assert_eq!(h.wait(), Ok(0));
        t.join().unwrap();
    }

    #[test]
    fn await_completes() {
        let c = Completion::new(names(1), true, None, None);
        let h = handle_of(&c);
        let part = c.part(0);
        let t = std::thread::spawn(move || part.complete(Ok(Box::new(()))));
        assert_eq!(futures_executor::block_on(h), Ok(1));
        t.join().unwrap();
    }
}
