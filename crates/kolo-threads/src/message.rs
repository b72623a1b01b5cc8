//! What a mailbox holds: messages (an eager copy of the sender's elements,
//! or the sender's buffer itself, lent until the receiver has copied it)
//! and posted receives (the receiver's buffer, waiting for a sender to
//! copy into it).
//!
//! A lent buffer or a posted receive is one thread's buffer that another
//! thread copies once, directly: the single-copy (rendezvous) path for
//! large messages. Its owner keeps the buffer alive until the copy is
//! done or until it withdrew the entry under the inbox lock (see
//! `mailbox.rs`), so the copying thread only ever touches a live buffer.
//! Every entry keeps its element type: a receiver that asks for another
//! element type or another length gets an error, never reinterpreted bytes.

use kolo_protocol::DataType;
use kolo_transport::{Element, TransportError};
use parking_lot::Mutex;
use std::any::{Any, TypeId};
use std::sync::atomic::{AtomicBool, Ordering};

/// The element type and length of a message or of a receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    type_id: TypeId,
    dtype: DataType,
    len: usize,
}

impl Layout {
    pub(crate) fn of<T: Element>(buf: &[T]) -> Self {
        Layout {
            type_id: TypeId::of::<T>(),
            dtype: T::DTYPE,
            len: buf.len(),
        }
    }
}

/// `Ok` if a message of layout `message` fits a receive buffer of layout
/// `buffer`; otherwise an error naming both (and the receive, `what`).
pub(crate) fn fits(
    message: Layout,
    buffer: Layout,
    what: impl FnOnce() -> String,
) -> Result<(), TransportError> {
    if message.type_id != buffer.type_id {
        return Err(TransportError::InvalidArgument(format!(
            "{}: the message holds {} elements but the receive buffer holds {}",
            what(),
            message.dtype,
            buffer.dtype
        )));
    }
    if message.len != buffer.len {
        return Err(TransportError::InvalidArgument(format!(
            "{}: the message has {} elements but the receive buffer has {}",
            what(),
            message.len,
            buffer.len
        )));
    }
    Ok(())
}

/// The address of another thread's buffer, with its layout.
struct Raw {
    addr: *mut u8,
    layout: Layout,
}

// SAFETY: a `Raw` is only an address; it is dereferenced only by
// `Lent::copy_into` and `Posted::fill_from`, whose owners keep the buffer
// alive and unaliased (see the module doc) while another thread copies.
unsafe impl Send for Raw {}
// SAFETY: as for `Send`; shared access only reads the address and layout.
unsafe impl Sync for Raw {}

/// Set once by the thread that finished a copy, read by the owner of the
/// buffer: done, and the outcome (posted receives only).
#[derive(Default)]
pub(crate) struct Signal {
    done: AtomicBool,
    outcome: Mutex<Option<Result<(), TransportError>>>,
}

impl Signal {
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    fn complete(&self, outcome: Result<(), TransportError>) {
        *self.outcome.lock() = Some(outcome);
        self.done.store(true, Ordering::SeqCst);
    }

    /// The outcome once done (an error if asked too early).
    pub(crate) fn outcome(&self) -> Result<(), TransportError> {
        self.outcome.lock().take().unwrap_or_else(|| {
            Err(TransportError::Backend(
                "a receive ended before its message arrived".into(),
            ))
        })
    }
}

/// A message: an owned copy, or the sender's buffer lent to the receiver.
pub(crate) enum Message {
    /// The sender's elements, as a `Vec<T>` of their type.
    Eager {
        layout: Layout,
        data: Box<dyn Any + Send>,
    },
    Lent(Lent),
}

impl Message {
    /// Copies `buf` into a message.
    pub(crate) fn eager<T: Element>(buf: &[T]) -> Self {
        Message::Eager {
            layout: Layout::of(buf),
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
        match self {
            Message::Eager { layout, data } => {
                fits(layout, Layout::of(buf), what)?;
                // `fits` compared the type ids, so this cannot miss.
                if let Some(data) = data.downcast_ref::<Vec<T>>() {
                    buf.copy_from_slice(data);
                }
                Ok(())
            }
            Message::Lent(lent) => lent.copy_into(buf, what),
        }
    }
}

/// The sender's buffer, lent until `done` is signalled.
pub(crate) struct Lent {
    buf: Raw,
    done: std::sync::Arc<Signal>,
}

impl Lent {
    /// Lends `buf`: the caller must keep it alive and unmodified until
    /// `done` is signalled or the message is withdrawn from its queue.
    pub(crate) fn new<T: Element>(buf: &[T], done: std::sync::Arc<Signal>) -> Self {
        Lent {
            buf: Raw {
                addr: buf.as_ptr().cast_mut().cast(),
                layout: Layout::of(buf),
            },
            done,
        }
    }

    /// Whether this is the loan signalled through `done`.
    pub(crate) fn is(&self, done: &std::sync::Arc<Signal>) -> bool {
        std::sync::Arc::ptr_eq(&self.done, done)
    }

    /// Copies the lent elements into `buf` (or fails, as
    /// [`Message::copy_into`]) and releases the loan either way.
    fn copy_into<T: Element>(
        self,
        buf: &mut [T],
        what: impl FnOnce() -> String,
    ) -> Result<(), TransportError> {
        let result = fits(self.buf.layout, Layout::of(buf), what).map(|()| {
            // SAFETY: the layouts match, so the lent buffer holds
            // `buf.len()` elements of type `T`; its owner keeps it alive and
            // unmodified until `done` is signalled below (it is blocked in
            // `sendrecv`), and this message was popped from its queue under
            // the inbox lock, so the owner cannot withdraw it meanwhile. The
            // two buffers belong to different calls, so they do not overlap
            // (a rank sending to itself lends `send` and receives into
            // `recv`, distinct borrows).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.buf.addr.cast_const().cast::<T>(),
                    buf.as_mut_ptr(),
                    buf.len(),
                );
            }
        });
        self.done.complete(Ok(()));
        result
    }
}

/// A receive waiting for its message: the receiver's buffer, filled by
/// the sender that claims it.
pub(crate) struct Posted {
    buf: Raw,
    pub(crate) signal: Signal,
}

impl Posted {
    /// Posts `buf`: the caller must keep it alive and untouched until
    /// `signal` is done or the receive is withdrawn from its inbox.
    pub(crate) fn new<T: Element>(buf: &mut [T]) -> Self {
        Posted {
            buf: Raw {
                addr: buf.as_mut_ptr().cast(),
                layout: Layout::of(buf),
            },
            signal: Signal::default(),
        }
    }

    /// Copies `send` into the posted buffer, or records why it does not
    /// fit (`what` names the receive), and signals the receiver.
    pub(crate) fn fill_from<T: Element>(&self, send: &[T], what: impl FnOnce() -> String) {
        let result = fits(Layout::of(send), self.buf.layout, what).map(|()| {
            // SAFETY: the layouts match, so the posted buffer holds
            // `send.len()` elements of type `T`; the receiver keeps it alive
            // and untouched until the signal below (it is blocked in `recv`),
            // and this receive was removed from the inbox under its lock by
            // the caller, so the receiver can no longer withdraw it. `send`
            // is a shared borrow of another buffer, so they do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(send.as_ptr(), self.buf.addr.cast::<T>(), send.len());
            }
        });
        self.signal.complete(result);
    }
}
