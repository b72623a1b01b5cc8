//! Where the engine leaves a submission's results: one [`Completion`] per
//! submission (a single tensor or a group). The engine completes the
//! submission's tensors ([`Part`]s) one by one or a fused run at a time;
//! the submission is done, its waiter woken once, when the last part is
//! in. A waiter on a host engine may run the engine's cycles itself while
//! it waits (see [`crate::engine::progress`]).

use crate::engine::lease::Lease;
use crate::engine::names::TensorNames;
use crate::engine::progress::Progress;
use crate::error::Error;
use crate::set_label::SetLabel;
use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::Waker;
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
    /// (see [`crate::engine::progress`]).
    progress: Option<Weak<dyn Progress>>,
    /// When it was submitted: the watchdog's timeout counts from here.
    submitted: Instant,
    /// The process set whose engine runs it: its errors name the set.
    set: Option<Arc<SetLabel>>,
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
    waker: Option<Waker>,
    /// Held until every part is in: the claim of a scope on the caller's
    /// memory, released only after the engine's last access to it.
    lease: Option<Lease>,
    /// The results were handed out.
    taken: bool,
    /// The lease of a submission the watchdog failed while the engine may
    /// still hold its tensors (see [`Completion::abandon`]): released only
    /// when the last reference to the completion goes, the engine's
    /// included.
    kept: Option<Lease>,
}

/// What a done submission delivered: every part's output, in order, or
/// what failed.
pub(crate) type Outcome = Result<Vec<Payload>, Failure>;

/// A done submission of which some parts failed.
pub(crate) struct Failure {
    /// The error of the lowest-numbered failed part (the others were
    /// performed, on the caller's memory in place).
    pub(crate) error: Error,
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
        Completion::in_set(names, payloads, lease, progress, None)
    }

    /// [`Completion::new`] in the engine of process set `set`.
    pub(crate) fn in_set(
        names: Arc<TensorNames>,
        payloads: bool,
        lease: Option<Lease>,
        progress: Option<Weak<dyn Progress>>,
        set: Option<Arc<SetLabel>>,
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
                waker: None,
                lease,
                taken: false,
                kept: None,
            }),
            done: Condvar::new(),
            finished: CachePadded::new(AtomicBool::new(false)),
            progress,
            submitted: Instant::now(),
            set,
        });
        if parts == 0 {
            completion.finish(&mut completion.state.lock());
        }
        completion
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

    /// Fails every part not in yet with `error(its tensor's name)` on
    /// behalf of the watchdog, while the engine may still hold the
    /// tensors: the waiter wakes now, but the lease on lent memory stays
    /// until the engine lets go of the submission (a scope does not end
    /// while a blocked backend may still write into its memory).
    pub(crate) fn abandon(&self, error: impl Fn(&str) -> Error) {
        let mut state = self.state.lock();
        if self.finished.load(Ordering::Acquire) {
            return;
        }
        state.kept = state.lease.take();
        drop(state);
        self.fail_open(error);
    }

    /// When the submission was made.
    pub(crate) fn submitted(&self) -> Instant {
        self.submitted
    }

    /// True once every part is in.
    pub(crate) fn is_done(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Blocks until done and takes the results: for up to
    /// [`POLL_BEFORE_SLEEP`] runs the engine's cycles on this thread while
    /// no other thread does (a host engine, see [`crate::engine::progress`]) or
    /// polls, yielding the CPU; then makes sure the background thread is
    /// awake and sleeps on the condition variable.
    pub(crate) fn wait(&self) -> Option<Outcome> {
        self.wait_for(None)
    }

    /// [`Completion::wait`] that gives up at `deadline`: `None` (the
    /// results stay) if the submission is not done by then.
    pub(crate) fn wait_until(&self, deadline: Instant) -> Option<Outcome> {
        self.wait_for(Some(deadline))
    }

    fn wait_for(&self, deadline: Option<Instant>) -> Option<Outcome> {
        let polling = Instant::now() + POLL_BEFORE_SLEEP;
        let polling = deadline.map_or(polling, |d| d.min(polling));
        let progress = self.progress.as_ref().and_then(Weak::upgrade);
        while !self.is_done() && Instant::now() < polling {
            let ran = progress
                .as_ref()
                .is_some_and(|p| p.run_until(&|| self.is_done(), polling));
            if !ran {
                std::thread::yield_now();
            }
        }
        if let Some(progress) = progress.filter(|_| !self.is_done()) {
            progress.wake();
        }
        let mut state = self.state.lock();
        while !self.finished.load(Ordering::Acquire) {
            match deadline {
                None => self.done.wait(&mut state),
                Some(deadline) => {
                    if self.done.wait_until(&mut state, deadline).timed_out()
                        && !self.finished.load(Ordering::Acquire)
                    {
                        return None;
                    }
                }
            }
        }
        take(&mut state, self.set.as_deref())
    }

    /// Takes the results if done; otherwise remembers `waker` (if any).
    pub(crate) fn try_take(&self, waker: Option<&Waker>) -> Option<Outcome> {
        let mut state = self.state.lock();
        if !self.finished.load(Ordering::Acquire) {
            if let Some(waker) = waker {
                state.waker = Some(waker.clone());
            }
            return None;
        }
        take(&mut state, self.set.as_deref())
    }
}

/// Takes a done submission's results out of `state`, once.
fn take(state: &mut State, set: Option<&SetLabel>) -> Option<Outcome> {
    if std::mem::replace(&mut state.taken, true) {
        return None;
    }
    if let Some((_, error)) = state.error.take() {
        let error = match set {
            Some(set) => error.in_process_set(set),
            None => error,
        };
        return Some(Err(Failure { error }));
    }
    let outputs: Vec<Payload> = std::mem::take(&mut state.payloads)
        .into_iter()
        .map(|p| p.unwrap_or_else(|| Box::new(())))
        .collect();
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
