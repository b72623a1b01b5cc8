//! Handles on operations in flight: block with [`Handle::wait`], check with
//! [`Handle::poll`], or `.await` them.
//!
//! Every handle belongs to a [`crate::Scope`], which keeps the caller's
//! buffers borrowed until the engine is done with them, whatever becomes
//! of the handle: forgetting a handle (`std::mem::forget`) or dropping it
//! only discards what it would return; the operation still runs on every
//! rank. A handle holds its submission's
//! [`Completion`](crate::engine::completion::Completion), where the engine
//! leaves the results.

use crate::engine::completion::{Completion, Outcome, Payload};
use crate::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Turns what a handle's submission delivered into its output (copying
/// results into the caller's buffers where the operation copies).
type Finish<'a, O> = Box<dyn FnOnce(Vec<Payload>) -> Result<O, Error> + Send + 'a>;

/// An operation in flight, borrowing the caller's output buffer (if any)
/// for `'a`.
///
/// The operation runs whether or not the handle is kept: dropping (or
/// forgetting) it discards the result, never the operation. An allreduce
/// writes the caller's buffer in place as it completes; the other
/// collectives write their output by [`Handle::wait`], by [`Handle::poll`]
/// once it returns `Some`, or by `.await`. A tensor that failed is left
/// untouched; the other tensors of a group are delivered (see
/// [`crate::Kolo::allreduce_group`] for the rule every call follows).
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
        Handle {
            completion,
            finish: Some(Box::new(finish)),
        }
    }

    /// A handle whose result was taken: every call on it errs (what a
    /// handle moved out of its owner leaves behind).
    pub(crate) fn spent() -> Self {
        Handle {
            completion: Completion::new(Arc::default(), false, None, None),
            finish: None,
        }
    }

    /// A handle that completed at once with `value`.
    pub(crate) fn done(value: O) -> Self
    where
        O: Send + 'a,
    {
        Handle::new(
            Completion::new(Arc::default(), false, None, None),
            move |_| Ok(value),
        )
    }

    /// This handle with its output turned by `f`.
    pub(crate) fn map<P>(self, f: impl FnOnce(O) -> P + Send + 'a) -> Handle<'a, P>
    where
        O: 'a,
    {
        let Handle { completion, finish } = self;
        Handle {
            completion,
            finish: finish.map(|finish| -> Finish<'a, P> {
                Box::new(move |payloads| finish(payloads).map(f))
            }),
        }
    }

    /// The names of the tensors the handle waits for.
    pub fn tensors(&self) -> impl Iterator<Item = &str> {
        self.completion.names().iter()
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
            .unwrap_or_else(|| Err(spent(self.completion.names().first())))
    }

    /// Blocks until the operation completed or `timeout` passed: the
    /// result as [`Handle::wait`] gives it, or `None` at the timeout (the
    /// operation goes on; wait again, or poll). After it returned `Some`,
    /// the handle is spent.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<O, Error>> {
        let deadline = Instant::now().checked_add(timeout);
        self.advance(|c| match deadline {
            Some(deadline) => c.wait_until(deadline),
            None => c.wait(),
        })
    }

    /// Takes the results with `take`; once they are in, finishes.
    fn advance(
        &mut self,
        take: impl FnOnce(&Completion) -> Option<Outcome>,
    ) -> Option<Result<O, Error>> {
        if self.finish.is_none() {
            return Some(Err(spent(self.completion.names().first())));
        }
        let outcome = take(&self.completion)?;
        let finish = self.finish.take()?;
        Some(outcome.map_err(|failure| failure.error).and_then(finish))
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
        let names = self.completion.names();
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
    use crate::engine::names::TensorNames;

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
        let leases = Arc::new(crate::engine::lease::Leases::default());
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
