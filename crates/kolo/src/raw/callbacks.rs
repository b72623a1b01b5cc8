//! The callback thread of [`RawHandle::on_complete`]: one per process,
//! started with the first callback. A handle's completion wakes it (the
//! engine's thread only sends on a channel: a callback never runs on the
//! engine's thread, where one that blocks or submits would stall every
//! rank), and it runs the callback once the result is in.

use super::handle::{RawHandle, RawOutput};
use crate::error::Error;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
use std::task::{Poll, Wake, Waker};

/// What a caller wants done with a result.
pub(crate) type Callback = Box<dyn FnOnce(Result<Option<RawOutput>, Error>) + Send>;

/// A handle and its callback, until the callback ran.
struct Pending {
    slot: Mutex<Option<(RawHandle, Callback)>>,
}

impl Wake for Pending {
    /// Called with the engine's completion lock held: only queues.
    fn wake(self: Arc<Self>) {
        queue().send(self).ok();
    }
}

/// The callback thread's queue (the thread starts with it).
fn queue() -> &'static Sender<Arc<Pending>> {
    static QUEUE: OnceLock<Sender<Arc<Pending>>> = OnceLock::new();
    QUEUE.get_or_init(|| {
        let (sender, receiver) = crossbeam_channel::unbounded();
        // Without its thread no callback would ever run: a process that
        // cannot start one more thread has no way forward to offer.
        std::thread::Builder::new()
            .name("kolo-callbacks".into())
            .spawn(move || serve(receiver))
            .unwrap_or_else(|e| panic!("kolo cannot start its callback thread: {e}"));
        sender
    })
}

/// Runs each woken callback whose result is in; one still in flight
/// (woken early) is left to its next wake-up.
fn serve(queue: Receiver<Arc<Pending>>) {
    for pending in queue {
        let waker = Waker::from(Arc::clone(&pending));
        let mut slot = pending.slot.lock();
        let Some((handle, _)) = slot.as_mut() else {
            continue;
        };
        if let Poll::Ready(result) = handle.poll_with(&waker) {
            let taken = slot.take();
            drop(slot);
            if let Some((handle, callback)) = taken {
                drop(handle);
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(result)));
                if let Err(panic) = outcome {
                    tracing::error!(
                        "a kolo completion callback panicked: {}",
                        crate::panic_text::panic_text(panic.as_ref())
                    );
                }
            }
        }
    }
}

/// Calls `callback` on the callback thread once `handle` completed.
pub(crate) fn when_done(handle: RawHandle, callback: Callback) {
    let pending = Arc::new(Pending {
        slot: Mutex::new(Some((handle, callback))),
    });
    // The first poll registers the waker (or finds the result in).
    queue().send(pending).ok();
}
