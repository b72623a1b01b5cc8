//! The writer thread: owns the file, formats and writes every event.
//!
//! The file is a JSON array that is never closed: `[` then one record per
//! line, each followed by `,\n`. Perfetto and chrome://tracing accept such an
//! unterminated array (the trace-event format allows it precisely so that a
//! trace survives a crash), so the file is loadable after every flush, also
//! when the process dies. Even a clean close leaves it unterminated, so that
//! the file looks the same however the process ended.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::event::Event;
use crate::recorder::Recorder;
use crate::TimelineError;

/// The longest that written events wait in the buffer while more arrive.
pub(crate) const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// What the handles send to the writer thread.
pub(crate) enum Message {
    Event(Event),
    /// Flush everything received so far, then answer.
    Flush(Sender<Result<(), TimelineError>>),
    /// The last handle is gone: flush and stop.
    Close,
}

/// The first write error, kept to be returned by every later flush.
struct Failure {
    kind: io::ErrorKind,
    message: String,
}

pub(crate) struct Writer {
    path: PathBuf,
    file: BufWriter<File>,
    messages: Receiver<Message>,
    recorder: Recorder,
    line: Vec<u8>,
    dirty: bool,
    last_flush: Instant,
    failure: Option<Failure>,
}

impl Writer {
    /// A writer for `file`, whose header (`[`) is already in the buffer.
    pub(crate) fn new(path: PathBuf, file: BufWriter<File>, messages: Receiver<Message>) -> Self {
        Writer {
            path,
            file,
            messages,
            recorder: Recorder::new(),
            line: Vec::new(),
            dirty: true,
            last_flush: Instant::now(),
            failure: None,
        }
    }

    /// Serves messages until `Close` (or every sender is gone).
    pub(crate) fn run(mut self) {
        self.flush_file();
        loop {
            let message = if self.dirty {
                let wait = FLUSH_INTERVAL.saturating_sub(self.last_flush.elapsed());
                match self.messages.recv_timeout(wait) {
                    Ok(message) => message,
                    Err(RecvTimeoutError::Timeout) => {
                        self.flush_file();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match self.messages.recv() {
                    Ok(message) => message,
                    Err(_) => break,
                }
            };
            match message {
                Message::Event(event) => {
                    self.write_event(&event);
                    if self.last_flush.elapsed() >= FLUSH_INTERVAL {
                        self.flush_file();
                    }
                }
                Message::Flush(ack) => {
                    self.flush_file();
                    // The flusher may have given up waiting; nothing to do then.
                    let _ = ack.send(self.status());
                }
                Message::Close => break,
            }
        }
        self.flush_file();
        // After a failure the buffer may hold part of a record: drop it
        // unwritten instead of letting BufWriter's drop try again.
        let (_file, _unwritten) = self.file.into_parts();
    }

    fn write_event(&mut self, event: &Event) {
        if self.failure.is_some() {
            return;
        }
        self.line.clear();
        let written = match self.recorder.record(event, &mut self.line) {
            Ok(()) => self.file.write_all(&self.line),
            Err(error) => Err(io::Error::from(error)),
        };
        match written {
            Ok(()) => self.dirty = true,
            Err(error) => self.fail(&error),
        }
    }

    fn flush_file(&mut self) {
        self.last_flush = Instant::now();
        if self.failure.is_some() || !self.dirty {
            return;
        }
        match self.file.flush() {
            Ok(()) => self.dirty = false,
            Err(error) => self.fail(&error),
        }
    }

    fn fail(&mut self, error: &io::Error) {
        self.dirty = false;
        if self.failure.is_none() {
            self.failure = Some(Failure {
                kind: error.kind(),
                message: error.to_string(),
            });
        }
    }

    fn status(&self) -> Result<(), TimelineError> {
        match &self.failure {
            None => Ok(()),
            Some(failure) => Err(TimelineError::Write {
                path: self.path.clone(),
                source: io::Error::new(failure.kind, failure.message.clone()),
            }),
        }
    }
}
