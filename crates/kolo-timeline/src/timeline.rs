//! The [`Timeline`] handle the engine calls.

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crossbeam_channel::Sender;

use crate::event::{Action, Event};
use crate::writer::{Message, Writer};
use crate::TimelineError;

/// A handle on a trace file, or on nothing.
///
/// Cheap to clone (one `Arc`) and usable from any thread. When disabled,
/// every method is one branch: no allocation, no lock, no channel send.
/// When enabled, each call stamps the time on the calling thread and sends
/// the event to the writer thread, which never blocks the caller. The last
/// handle to go flushes the file and joins the writer thread.
#[derive(Clone, Default)]
pub struct Timeline {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    messages: Sender<Message>,
    start: Instant,
    mark_cycles: bool,
    path: PathBuf,
    writer: Option<JoinHandle<()>>,
}

impl Timeline {
    /// A timeline that records nothing and costs one branch per call.
    pub fn disabled() -> Timeline {
        Timeline { inner: None }
    }

    /// Creates (truncates) the trace file at `path` and starts its writer
    /// thread. Timestamps count from now. With `mark_cycles`, [`mark_cycle`]
    /// writes a `CYCLE_START` marker across all rows.
    ///
    /// [`mark_cycle`]: Timeline::mark_cycle
    pub fn create(path: impl AsRef<Path>, mark_cycles: bool) -> Result<Timeline, TimelineError> {
        let path = path.as_ref().to_path_buf();
        let create_error = |source| TimelineError::Create {
            path: path.clone(),
            source,
        };
        let mut file = BufWriter::new(File::create(&path).map_err(create_error)?);
        file.write_all(b"[\n").map_err(create_error)?;
        let (messages, received) = crossbeam_channel::unbounded();
        let writer = Writer::new(path.clone(), file, received);
        let writer = thread::Builder::new()
            .name("kolo-timeline".to_owned())
            .spawn(move || writer.run())
            .map_err(|source| TimelineError::Spawn {
                path: path.clone(),
                source,
            })?;
        Ok(Timeline {
            inner: Some(Arc::new(Inner {
                messages,
                start: Instant::now(),
                mark_cycles,
                path,
                writer: Some(writer),
            })),
        })
    }

    /// Whether events are recorded.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// The trace file, when enabled.
    pub fn path(&self) -> Option<&Path> {
        self.inner.as_deref().map(|inner| inner.path.as_path())
    }

    /// Negotiation of `tensor` began: opens a `NEGOTIATE_<kind>` span on its
    /// row (`kind` like `"ALLREDUCE"`).
    pub fn negotiate_start(&self, tensor: &str, kind: &str) {
        let Some(inner) = &self.inner else { return };
        inner.send(
            tensor,
            Action::NegotiateStart {
                kind: kind.to_owned(),
            },
        );
    }

    /// `rank`'s request for `tensor` arrived: an instant event named by the
    /// rank (`"1"`), inside the negotiation span.
    pub fn negotiate_rank_ready(&self, tensor: &str, rank: u32) {
        let Some(inner) = &self.inner else { return };
        inner.send(tensor, Action::RankReady { rank });
    }

    /// Negotiation of `tensor` ended: closes its negotiation span.
    pub fn negotiate_end(&self, tensor: &str) {
        let Some(inner) = &self.inner else { return };
        inner.send(tensor, Action::NegotiateEnd);
    }

    /// The operation on `tensor` began: opens a span named `op`
    /// (e.g. `"ALLREDUCE"`).
    pub fn op_start(&self, tensor: &str, op: &str) {
        let Some(inner) = &self.inner else { return };
        inner.send(tensor, Action::OpStart { op: op.to_owned() });
    }

    /// The operation on `tensor` ended: closes any activity still open in
    /// it, then the operation's span, whose end carries `dtype` and `shape`.
    pub fn op_end(&self, tensor: &str, dtype: &str, shape: &[u64]) {
        let Some(inner) = &self.inner else { return };
        inner.send(
            tensor,
            Action::OpEnd {
                dtype: dtype.to_owned(),
                shape: shape.to_vec(),
            },
        );
    }

    /// An activity (see [`crate::activity`]) on `tensor` began: opens a span
    /// nested in the current one.
    pub fn activity_start(&self, tensor: &str, activity: &str) {
        let Some(inner) = &self.inner else { return };
        inner.send(
            tensor,
            Action::ActivityStart {
                activity: activity.to_owned(),
            },
        );
    }

    /// The innermost open activity of `tensor` ended. Ignored when no
    /// activity is open on its row.
    pub fn activity_end(&self, tensor: &str) {
        let Some(inner) = &self.inner else { return };
        inner.send(tensor, Action::ActivityEnd);
    }

    /// [`activity_start`](Timeline::activity_start) for every tensor of a
    /// fused response, all at the same time stamp.
    pub fn activity_start_all(&self, tensors: &[&str], activity: &str) {
        let Some(inner) = &self.inner else { return };
        let ts_ns = inner.now_ns();
        for tensor in tensors {
            inner.send_at(
                ts_ns,
                tensor,
                Action::ActivityStart {
                    activity: activity.to_owned(),
                },
            );
        }
    }

    /// [`activity_end`](Timeline::activity_end) for every tensor of a fused
    /// response, all at the same time stamp.
    pub fn activity_end_all(&self, tensors: &[&str]) {
        let Some(inner) = &self.inner else { return };
        let ts_ns = inner.now_ns();
        for tensor in tensors {
            inner.send_at(ts_ns, tensor, Action::ActivityEnd);
        }
    }

    /// Marks the start of a background cycle (a global `CYCLE_START`
    /// instant); nothing unless the timeline was created with `mark_cycles`.
    pub fn mark_cycle(&self) {
        let Some(inner) = &self.inner else { return };
        if inner.mark_cycles {
            let ts_ns = inner.now_ns();
            // A send fails only when the writer is gone; flush() reports that.
            let _ = inner
                .messages
                .send(Message::Event(Event::CycleStart { ts_ns }));
        }
    }

    /// Waits until every event sent before this call is written to the file
    /// and flushed. Returns the writer's first write error, if it met one
    /// (then and ever after: the writer stops at the first failure).
    pub fn flush(&self) -> Result<(), TimelineError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let gone = || TimelineError::WriterGone {
            path: inner.path.clone(),
        };
        let (ack, acked) = crossbeam_channel::bounded(1);
        inner
            .messages
            .send(Message::Flush(ack))
            .map_err(|_| gone())?;
        acked.recv().map_err(|_| gone())?
    }
}

impl Inner {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn send(&self, tensor: &str, action: Action) {
        self.send_at(self.now_ns(), tensor, action);
    }

    fn send_at(&self, ts_ns: u64, tensor: &str, action: Action) {
        let event = Event::Tensor {
            ts_ns,
            tensor: tensor.to_owned(),
            action,
        };
        // A send fails only when the writer is gone; flush() reports that.
        let _ = self.messages.send(Message::Event(event));
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every event sent before is ahead of Close in the channel.
        let _ = self.messages.send(Message::Close);
        if let Some(writer) = self.writer.take() {
            // A panicked writer has nothing left to flush; drop must not panic.
            let _ = writer.join();
        }
    }
}

impl fmt::Debug for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            None => f.write_str("Timeline(disabled)"),
            Some(inner) => f
                .debug_struct("Timeline")
                .field("path", &inner.path)
                .field("mark_cycles", &inner.mark_cycles)
                .finish(),
        }
    }
}
