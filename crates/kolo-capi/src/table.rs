//! The process's engine and its handle table. A C handle is a number,
//! never a pointer: an unknown or released one is an error, not a read
//! of freed memory.

use crate::status::{code_of, Failure, KOLO_ERR_NOT_INITIALIZED, KOLO_ERR_UNKNOWN_HANDLE};
use kolo::raw::{RawHandle, RawOutput};
use kolo::Kolo;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::Arc;
use std::time::Duration;

/// The engine `kolo_init` started.
static ENGINE: RwLock<Option<Arc<Kolo>>> = RwLock::new(None);

/// The engine, or the error of a call before `kolo_init`.
pub(crate) fn engine() -> Result<Arc<Kolo>, Failure> {
    ENGINE.read().clone().ok_or_else(|| Failure {
        code: KOLO_ERR_NOT_INITIALIZED,
        message: "kolo is not initialised: call kolo_init first".into(),
    })
}

/// The engine if one runs.
pub(crate) fn running() -> Option<Arc<Kolo>> {
    ENGINE.read().clone()
}

/// Sets the engine (once; `false` if one runs already).
pub(crate) fn install(kolo: Kolo) -> bool {
    let mut engine = ENGINE.write();
    if engine.is_some() {
        return false;
    }
    *engine = Some(Arc::new(kolo));
    true
}

/// Takes the engine out (for `kolo_shutdown`).
pub(crate) fn uninstall() -> Option<Arc<Kolo>> {
    ENGINE.write().take()
}

/// An output as C reads it: the shape and splits as `int64_t`s, kept
/// with the output so that the pointers handed out stay valid until the
/// handle is released.
pub(crate) struct Output {
    pub(crate) raw: RawOutput,
    pub(crate) shape: Vec<i64>,
    pub(crate) splits: Vec<i64>,
}

impl From<RawOutput> for Output {
    fn from(raw: RawOutput) -> Output {
        let shape = raw.shape().iter().map(|&d| d as i64).collect();
        let splits = raw.splits().iter().map(|&s| s as i64).collect();
        Output { raw, shape, splits }
    }
}

/// What an operation ended with: its output, or its status code and
/// message.
pub(crate) type Outcome = Result<Option<Output>, (i32, CString)>;

/// Turns a raw handle's result into an outcome.
pub(crate) fn outcome(result: Result<Option<RawOutput>, kolo::Error>) -> Outcome {
    result.map(|o| o.map(Output::from)).map_err(|e| {
        let text = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
        (code_of(&e), text)
    })
}

/// One handle.
enum Entry {
    /// In flight.
    Pending(RawHandle),
    /// In flight, waited for by a thread that took the raw handle out.
    Waiting,
    /// Done (or reported to its callback, which runs now).
    Done(Outcome),
}

#[derive(Default)]
struct Table {
    next: i64,
    entries: HashMap<i64, Entry>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn with_table<R>(f: impl FnOnce(&mut Table) -> R) -> R {
    f(TABLE.lock().get_or_insert_with(Table::default))
}

fn unknown(handle: i64) -> Failure {
    Failure {
        code: KOLO_ERR_UNKNOWN_HANDLE,
        message: format!("no handle {handle} (never made, or released)"),
    }
}

/// Keeps `raw` under a new handle number.
pub(crate) fn insert(raw: RawHandle) -> i64 {
    with_table(|t| {
        t.next += 1;
        t.entries.insert(t.next, Entry::Pending(raw));
        t.next
    })
}

/// Keeps `outcome` under a new handle number (what a callback is handed).
pub(crate) fn insert_done(outcome: Outcome) -> i64 {
    with_table(|t| {
        t.next += 1;
        t.entries.insert(t.next, Entry::Done(outcome));
        t.next
    })
}

/// Forgets `handle`; the operation of one still in flight goes on.
pub(crate) fn release(handle: i64) -> Result<(), Failure> {
    with_table(|t| match t.entries.get(&handle) {
        None => Err(unknown(handle)),
        Some(Entry::Waiting) => Err(Failure::invalid(format!(
            "handle {handle} is being waited for on another thread"
        ))),
        Some(_) => {
            t.entries.remove(&handle);
            Ok(())
        }
    })
}

/// Polls `handle`: `None` while in flight, else its outcome applied to
/// `read`.
pub(crate) fn poll<R>(handle: i64, read: impl FnOnce(&Outcome) -> R) -> Result<Option<R>, Failure> {
    with_table(|t| {
        let entry = t.entries.get_mut(&handle).ok_or_else(|| unknown(handle))?;
        if let Entry::Pending(raw) = entry {
            if let Some(result) = raw.poll() {
                *entry = Entry::Done(outcome(result));
            }
        }
        Ok(match entry {
            Entry::Done(outcome) => Some(read(outcome)),
            _ => None,
        })
    })
}

/// Waits up to `timeout` for `handle` (without holding the table), then
/// polls it as [`poll`] does.
pub(crate) fn wait<R>(
    handle: i64,
    timeout: Duration,
    read: impl FnOnce(&Outcome) -> R,
) -> Result<Option<R>, Failure> {
    let taken = with_table(|t| {
        let entry = t.entries.get_mut(&handle).ok_or_else(|| unknown(handle))?;
        match std::mem::replace(entry, Entry::Waiting) {
            Entry::Pending(raw) => Ok(Some(raw)),
            Entry::Waiting => Err(Failure::invalid(format!(
                "handle {handle} is being waited for on another thread"
            ))),
            done => {
                *entry = done;
                Ok(None)
            }
        }
    })?;
    if let Some(mut raw) = taken {
        let result = raw.wait_timeout(timeout);
        with_table(|t| {
            let entry = match result {
                Some(result) => Entry::Done(outcome(result)),
                None => Entry::Pending(raw),
            };
            t.entries.insert(handle, entry);
        });
    }
    poll(handle, read)
}

/// Applies `read` to the output of `handle`'s finished allgather or
/// alltoall.
pub(crate) fn output<R>(handle: i64, read: impl FnOnce(&Output) -> R) -> Result<R, Failure> {
    let outcome = poll(handle, |outcome| match outcome {
        Ok(Some(output)) => Ok(read(output)),
        Ok(None) => Err(Failure::invalid(format!(
            "handle {handle}'s operation wrote in place: it has no output"
        ))),
        Err((code, message)) => Err(Failure {
            code: *code,
            message: message.to_string_lossy().into_owned(),
        }),
    })?;
    outcome.unwrap_or_else(|| {
        Err(Failure::invalid(format!(
            "handle {handle}'s operation is still in flight"
        )))
    })
}

/// The error text of `handle`'s operation (null while in flight or after
/// a success), valid while the handle is kept.
pub(crate) fn error_text(handle: i64) -> Result<*const c_char, Failure> {
    let text = poll(handle, |outcome| match outcome {
        Err((_, message)) => message.as_ptr(),
        Ok(_) => std::ptr::null(),
    })?;
    Ok(text.unwrap_or(std::ptr::null()))
}
