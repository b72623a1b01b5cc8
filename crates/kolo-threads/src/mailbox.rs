//! Buffered point-to-point messages: one inbox per destination rank, one
//! FIFO queue per (source, tag) inside it.
//!
//! `post` copies the elements into the queue and returns at once, so
//! `send` never waits for the receiver; `take` waits for the next message
//! of its queue. Messages keep their Rust type, so a receiver that asks for
//! another element type gets an error, never reinterpreted bytes.

use crate::backoff::Backoff;
use crate::health::Health;
use crossbeam_utils::CachePadded;
use kolo_transport::{Element, TransportError};
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

/// One message: the sender's elements, as a `Vec<T>` of their type.
pub(crate) struct Message {
    dtype: kolo_protocol::DataType,
    data: Box<dyn Any + Send>,
}

impl Message {
    /// Copies `buf` into a message.
    pub(crate) fn new<T: Element>(buf: &[T]) -> Self {
        Message {
            dtype: T::DTYPE,
            data: Box::new(buf.to_vec()),
        }
    }

    /// Copies the message into `buf`: an error if the element type or the
    /// length differs. `what` names the receive in the error.
    pub(crate) fn copy_into<T: Element>(
        self,
        buf: &mut [T],
        what: impl FnOnce() -> String,
    ) -> Result<(), TransportError> {
        let Ok(data) = self.data.downcast::<Vec<T>>() else {
            return Err(TransportError::InvalidArgument(format!(
                "{}: the message holds {} elements but the receive buffer holds {}",
                what(),
                self.dtype,
                T::DTYPE
            )));
        };
        if data.len() != buf.len() {
            return Err(TransportError::InvalidArgument(format!(
                "{}: the message has {} elements but the receive buffer has {}",
                what(),
                data.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(&data);
        Ok(())
    }
}

type Queues = HashMap<(usize, u32), VecDeque<Message>>;

#[derive(Default)]
struct Inbox {
    queues: Mutex<Queues>,
    cond: Condvar,
    /// Bumped on every post: lets a receiver spin without the lock.
    posts: AtomicU64,
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

impl Mailboxes {
    pub(crate) fn new(size: usize) -> Self {
        Mailboxes {
            inboxes: (0..size)
                .map(|_| CachePadded::new(Inbox::default()))
                .collect(),
        }
    }

    /// Queues `message` from `src` for `dst` (both valid ranks).
    pub(crate) fn post(&self, src: usize, dst: usize, tag: u32, message: Message) {
        let Some(inbox) = self.inboxes.get(dst) else {
            return;
        };
        inbox
            .queues
            .lock()
            .entry((src, tag))
            .or_default()
            .push_back(message);
        inbox.posts.fetch_add(1, Ordering::SeqCst);
        inbox.cond.notify_all();
    }

    /// Waits for the next message from `src` with `tag` in `dst`'s inbox.
    /// Messages `src` posted before going down are still delivered; once
    /// its queue is empty and it is down, fails with `PeerFailed`.
    pub(crate) fn take(
        &self,
        dst: usize,
        src: usize,
        tag: u32,
        health: &Health,
        backoff: &Backoff,
    ) -> Result<Message, TransportError> {
        let Some(inbox) = self.inboxes.get(dst) else {
            return Err(TransportError::InvalidArgument(format!(
                "no inbox for rank {dst}"
            )));
        };
        let key = (src, tag);
        loop {
            let seen = inbox.posts.load(Ordering::SeqCst);
            if let Some(message) = pop(&mut inbox.queues.lock(), key) {
                return Ok(message);
            }
            if health.is_down(src) {
                break;
            }
            let arrived = || inbox.posts.load(Ordering::SeqCst) != seen || health.is_down(src);
            if !backoff.spin_until(arrived) {
                break;
            }
        }
        let mut queues = inbox.queues.lock();
        loop {
            if let Some(message) = pop(&mut queues, key) {
                return Ok(message);
            }
            // The peer posts before it goes down, so an empty queue of a
            // down peer stays empty.
            if let Some(err) = health.failure_of(src) {
                return Err(err);
            }
            inbox.cond.wait(&mut queues);
        }
    }

    /// Wakes every sleeping receiver so it re-checks [`Health`].
    pub(crate) fn wake_all(&self) {
        for inbox in self.inboxes.iter() {
            let _guard = inbox.queues.lock();
            inbox.cond.notify_all();
        }
    }
}

fn pop(queues: &mut Queues, key: (usize, u32)) -> Option<Message> {
    let queue = queues.get_mut(&key)?;
    let message = queue.pop_front();
    if queue.is_empty() {
        queues.remove(&key);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn take_i32(
        mail: &Mailboxes,
        health: &Health,
        dst: usize,
        src: usize,
        tag: u32,
        len: usize,
    ) -> Result<Vec<i32>, TransportError> {
        let message = mail.take(dst, src, tag, health, &Backoff::for_ranks(2, 2))?;
        let mut buf = vec![0i32; len];
        message.copy_into(&mut buf, || "recv".to_string())?;
        Ok(buf)
    }

    #[test]
    fn order_is_kept_per_source_and_tag() {
        let (mail, health) = (Mailboxes::new(3), Health::new(3));
        for i in 0..5 {
            mail.post(0, 2, 7, Message::new(&[i]));
            mail.post(1, 2, 7, Message::new(&[100 + i]));
            mail.post(0, 2, 8, Message::new(&[200 + i]));
        }
        for i in 0..5 {
            assert_eq!(take_i32(&mail, &health, 2, 0, 8, 1).unwrap(), [200 + i]);
        }
        for i in 0..5 {
            assert_eq!(take_i32(&mail, &health, 2, 1, 7, 1).unwrap(), [100 + i]);
            assert_eq!(take_i32(&mail, &health, 2, 0, 7, 1).unwrap(), [i]);
        }
    }

    #[test]
    fn a_waiting_receiver_gets_a_later_post() {
        let (mail, health) = (Mailboxes::new(2), Health::new(2));
        thread::scope(|s| {
            let receiver = s.spawn(|| take_i32(&mail, &health, 1, 0, 3, 2));
            thread::sleep(std::time::Duration::from_millis(20));
            mail.post(0, 1, 3, Message::new(&[4, 5]));
            assert_eq!(receiver.join().unwrap().unwrap(), [4, 5]);
        });
    }

    #[test]
    fn a_departed_sender_delivers_then_fails() {
        let (mail, health) = (Mailboxes::new(2), Health::new(2));
        mail.post(0, 1, 0, Message::new(&[1]));
        health.mark(0, "rank 0 left the communicator".into(), 0);
        assert_eq!(take_i32(&mail, &health, 1, 0, 0, 1).unwrap(), [1]);
        let err = take_i32(&mail, &health, 1, 0, 0, 1).unwrap_err();
        assert_eq!(
            err,
            TransportError::PeerFailed {
                rank: 0,
                message: "rank 0 left the communicator".into()
            }
        );
    }

    #[test]
    fn a_sleeping_receiver_wakes_when_its_peer_fails() {
        let (mail, health) = (Mailboxes::new(2), Health::new(2));
        thread::scope(|s| {
            let receiver = s.spawn(|| take_i32(&mail, &health, 1, 0, 0, 1));
            thread::sleep(std::time::Duration::from_millis(20));
            health.mark(0, "boom".into(), 0);
            mail.wake_all();
            assert!(matches!(
                receiver.join().unwrap(),
                Err(TransportError::PeerFailed { rank: 0, .. })
            ));
        });
    }

    #[test]
    fn wrong_length_or_type_is_an_error_naming_both() {
        let (mail, health) = (Mailboxes::new(1), Health::new(1));
        mail.post(0, 0, 0, Message::new(&[1, 2, 3]));
        let err = take_i32(&mail, &health, 0, 0, 0, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("3 elements") && err.contains("has 2"), "{err}");
        mail.post(0, 0, 0, Message::new(&[1.0f32]));
        let err = take_i32(&mail, &health, 0, 0, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("f32") && err.contains("i32"), "{err}");
    }
}
