//! Point-to-point messages: one inbox per destination rank, holding per
//! (source, tag) a FIFO queue of messages and a FIFO queue of posted
//! receives (never both non-empty: a receive takes a queued message
//! before it posts, a send fills a posted receive before it queues).
//!
//! - [`Mailboxes::send`] never waits: it copies straight into a posted
//!   receive if there is one (one copy), else queues an eager copy for a
//!   later receive (two copies).
//! - [`Mailboxes::lend`] (large `sendrecv`s) fills a posted receive too,
//!   else queues the sender's buffer itself: the receiver copies out of it
//!   (one copy) and the sender waits for that in [`Loan::settle`].
//! - [`Mailboxes::recv`] takes the next queued message, else posts its
//!   buffer and waits for a sender to fill it.
//!
//! Messages a peer sent before it went down are still delivered; a
//! receive (or a loan) whose peer is down and that no one has claimed is
//! withdrawn and fails with `PeerFailed`. One that was claimed is being
//! copied by the live peer (a rank goes down only from its own thread, so
//! never in the middle of a copy) and completes.

use crate::backoff::Backoff;
use crate::health::Health;
use crate::message::{Lent, Message, Posted, Signal};
use crossbeam_utils::CachePadded;
use kolo_transport::{Element, TransportError};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;

type Key = (usize, u32);

#[derive(Default)]
struct Boxes {
    queued: HashMap<Key, VecDeque<Message>>,
    posted: HashMap<Key, VecDeque<Arc<Posted>>>,
}

#[derive(Default)]
struct Inbox {
    boxes: Mutex<Boxes>,
    /// Wakes the rank's thread: a message or a copy for it is done, or a
    /// peer went down.
    cond: Condvar,
}

/// The inboxes of every rank of a communicator.
pub(crate) struct Mailboxes {
    inboxes: Box<[CachePadded<Inbox>]>,
}

impl std::fmt::Debug for Mailboxes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailboxes")
            .field("ranks", &self.inboxes.len())
            .finish()
    }
}

/// The text naming a receive in its errors.
fn receive_of(src: usize, tag: u32) -> String {
    format!("recv from rank {src} with tag {tag}")
}

impl Mailboxes {
    pub(crate) fn new(size: usize) -> Self {
        Mailboxes {
            inboxes: (0..size)
                .map(|_| CachePadded::new(Inbox::default()))
                .collect(),
        }
    }

    fn inbox(&self, rank: usize) -> Result<&Inbox, TransportError> {
        self.inboxes
            .get(rank)
            .map(|inbox| &**inbox)
            .ok_or_else(|| TransportError::InvalidArgument(format!("no inbox for rank {rank}")))
    }

    /// Sends `buf` from `src` to `dst` without waiting for the receiver.
    pub(crate) fn send<T: Element>(
        &self,
        src: usize,
        dst: usize,
        tag: u32,
        buf: &[T],
    ) -> Result<(), TransportError> {
        let inbox = self.inbox(dst)?;
        let mut boxes = inbox.boxes.lock();
        if let Some(posted) = pop(&mut boxes.posted, (src, tag)) {
            drop(boxes);
            posted.fill_from(buf, || receive_of(src, tag));
            self.wake(dst);
            return Ok(());
        }
        boxes
            .queued
            .entry((src, tag))
            .or_default()
            .push_back(Message::eager(buf));
        inbox.cond.notify_all();
        Ok(())
    }

    /// Sends `buf` from `src` to `dst` by lending it: copied into a posted
    /// receive at once, or queued for the receiver to copy out. The
    /// returned loan keeps `buf` borrowed until it is settled (or
    /// dropped, which withdraws or waits out the loan). It must not be
    /// leaked (`mem::forget`): the receiver could then copy out of a
    /// buffer that no longer exists.
    pub(crate) fn lend<'a, T: Element>(
        &'a self,
        src: usize,
        dst: usize,
        tag: u32,
        buf: &'a [T],
        health: &'a Health,
        backoff: &'a Backoff,
    ) -> Result<Loan<'a>, TransportError> {
        let inbox = self.inbox(dst)?;
        let mut boxes = inbox.boxes.lock();
        let done = if let Some(posted) = pop(&mut boxes.posted, (src, tag)) {
            drop(boxes);
            posted.fill_from(buf, || receive_of(src, tag));
            self.wake(dst);
            None
        } else {
            let done = Arc::new(Signal::default());
            boxes
                .queued
                .entry((src, tag))
                .or_default()
                .push_back(Message::Lent(Lent::new(buf, Arc::clone(&done))));
            inbox.cond.notify_all();
            Some(done)
        };
        Ok(Loan {
            mail: self,
            health,
            backoff,
            src,
            dst,
            tag,
            done,
            _buf: PhantomData,
        })
    }

    /// Receives the next message from `src` with `tag` into `dst`'s `buf`.
    pub(crate) fn recv<T: Element>(
        &self,
        dst: usize,
        src: usize,
        tag: u32,
        buf: &mut [T],
        health: &Health,
        backoff: &Backoff,
    ) -> Result<(), TransportError> {
        let inbox = self.inbox(dst)?;
        let key = (src, tag);
        let mut boxes = inbox.boxes.lock();
        if let Some(message) = pop(&mut boxes.queued, key) {
            drop(boxes);
            let lent = matches!(message, Message::Lent(_));
            let result = message.copy_into(buf, || receive_of(src, tag));
            if lent {
                self.wake(src);
            }
            return result;
        }
        // Nothing queued: a peer that is down sends nothing more.
        if let Some(err) = health.failure_of(src) {
            return Err(err);
        }
        let posted = Arc::new(Posted::new(buf));
        boxes
            .posted
            .entry(key)
            .or_default()
            .push_back(Arc::clone(&posted));
        drop(boxes);
        let signal = &posted.signal;
        if !self.wait(dst, Some(src), health, backoff, || signal.is_done()) {
            let withdrawn = withdraw(&mut inbox.boxes.lock().posted, key, |p| {
                Arc::ptr_eq(p, &posted)
            });
            if withdrawn {
                return Err(health.failure_of(src).unwrap_or_else(|| {
                    TransportError::Backend(format!("{}: withdrawn", receive_of(src, tag)))
                }));
            }
            // Claimed by the sender, which is copying: wait it out.
            self.wait(dst, None, health, backoff, || signal.is_done());
        }
        posted.signal.outcome()
    }

    /// Waits on `rank`'s inbox until `ready` holds (true) or `peer` is
    /// down (false, unless `ready` holds by then).
    fn wait(
        &self,
        rank: usize,
        peer: Option<usize>,
        health: &Health,
        backoff: &Backoff,
        ready: impl Fn() -> bool,
    ) -> bool {
        let down = || peer.is_some_and(|p| health.is_down(p));
        if backoff.spin_until(|| ready() || down()) {
            return ready();
        }
        let Ok(inbox) = self.inbox(rank) else {
            return ready();
        };
        let mut boxes = inbox.boxes.lock();
        loop {
            if ready() {
                return true;
            }
            if down() {
                return ready();
            }
            inbox.cond.wait(&mut boxes);
        }
    }

    /// Wakes `rank`'s thread (after a copy it waits for is done).
    fn wake(&self, rank: usize) {
        if let Some(inbox) = self.inboxes.get(rank) {
            let _guard = inbox.boxes.lock();
            inbox.cond.notify_all();
        }
    }

    /// Wakes every sleeping rank so it re-checks [`Health`].
    pub(crate) fn wake_all(&self) {
        for rank in 0..self.inboxes.len() {
            self.wake(rank);
        }
    }
}

/// A buffer lent by [`Mailboxes::lend`]: borrowed until the receiver has
/// copied it, or until it is withdrawn.
pub(crate) struct Loan<'a> {
    mail: &'a Mailboxes,
    health: &'a Health,
    backoff: &'a Backoff,
    src: usize,
    dst: usize,
    tag: u32,
    /// `None` once settled (or when the send filled a posted receive).
    done: Option<Arc<Signal>>,
    _buf: PhantomData<&'a [u8]>,
}

impl Loan<'_> {
    /// With `wait`: waits until the receiver has copied the buffer, or
    /// withdraws it and fails with `PeerFailed` if the receiver went down
    /// first. Without: withdraws it at once unless the receiver is already
    /// copying (then waits for that), and returns `Ok`.
    pub(crate) fn settle(mut self, wait: bool) -> Result<(), TransportError> {
        self.finish(wait)
    }

    fn finish(&mut self, wait: bool) -> Result<(), TransportError> {
        let Some(done) = self.done.take() else {
            return Ok(());
        };
        let (mail, health, backoff) = (self.mail, self.health, self.backoff);
        let is_done = || done.is_done();
        if wait && mail.wait(self.src, Some(self.dst), health, backoff, is_done) {
            return Ok(());
        }
        let withdrawn = match mail.inbox(self.dst) {
            Ok(inbox) => withdraw(
                &mut inbox.boxes.lock().queued,
                (self.src, self.tag),
                |m| matches!(m, Message::Lent(lent) if lent.is(&done)),
            ),
            Err(_) => false,
        };
        if !withdrawn {
            // The receiver popped it and is copying: wait it out.
            mail.wait(self.src, None, health, backoff, is_done);
            return Ok(());
        }
        if !wait {
            return Ok(());
        }
        Err(health.failure_of(self.dst).unwrap_or_else(|| {
            TransportError::Backend(format!(
                "send to rank {} with tag {}: withdrawn",
                self.dst, self.tag
            ))
        }))
    }
}

impl Drop for Loan<'_> {
    /// Never leaves the buffer reachable from the inbox once its borrow
    /// ends.
    fn drop(&mut self) {
        let _ = self.finish(false);
    }
}

/// Pops the front of `key`'s queue in `map`, removing an emptied queue.
fn pop<V>(map: &mut HashMap<Key, VecDeque<V>>, key: Key) -> Option<V> {
    let queue = map.get_mut(&key)?;
    let front = queue.pop_front();
    if queue.is_empty() {
        map.remove(&key);
    }
    front
}

/// Removes the entry of `key`'s queue in `map` that `is_it` picks; false
/// if there is none (it was claimed).
fn withdraw<V>(map: &mut HashMap<Key, VecDeque<V>>, key: Key, is_it: impl Fn(&V) -> bool) -> bool {
    let Some(queue) = map.get_mut(&key) else {
        return false;
    };
    let Some(at) = queue.iter().position(is_it) else {
        return false;
    };
    queue.remove(at);
    if queue.is_empty() {
        map.remove(&key);
    }
    true
}

#[cfg(test)]
#[path = "mailbox_tests.rs"]
mod tests;
