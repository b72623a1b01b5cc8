//! Status codes, the text of the last error, and the guard every exported
//! function runs in: no panic crosses the boundary, and every failure
//! leaves its message for `kolo_last_error`.

use kolo::Error;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Success.
pub const KOLO_OK: i32 = 0;
/// The operation is still in flight (`kolo_poll`).
pub const KOLO_IN_PROGRESS: i32 = 1;
/// The wait's timeout passed; the operation goes on (`kolo_wait`).
pub const KOLO_TIMED_OUT: i32 = 2;
/// An argument cannot work (null pointer, negative dimension, unknown
/// data type or op, a shape that does not fit, ...); nothing was
/// submitted.
pub const KOLO_ERR_INVALID_ARGUMENT: i32 = -1;
/// `kolo_init` was not called (or `kolo_shutdown` was).
pub const KOLO_ERR_NOT_INITIALIZED: i32 = -2;
/// The ranks submitted the tensor with conflicting arguments; every rank
/// fails alike, and later operations are unaffected.
pub const KOLO_ERR_MISMATCH: i32 = -3;
/// The coordinator refused the tensor for another reason, on every rank.
pub const KOLO_ERR_REFUSED: i32 = -4;
/// Some ranks never submitted the tensor (the stall inspector gave up).
pub const KOLO_ERR_STALLED: i32 = -5;
/// The tensor's name is in flight already on this rank.
pub const KOLO_ERR_DUPLICATE_NAME: i32 = -6;
/// kolo shut down before the operation completed.
pub const KOLO_ERR_SHUT_DOWN: i32 = -7;
/// A rank failed while this one depended on it.
pub const KOLO_ERR_RANK_FAILED: i32 = -8;
/// The collective or the transport failed on this rank.
pub const KOLO_ERR_COLLECTIVE: i32 = -9;
/// A configuration value is malformed, or the engine cannot start.
pub const KOLO_ERR_START: i32 = -10;
/// No such handle (never made, or released).
pub const KOLO_ERR_UNKNOWN_HANDLE: i32 = -11;
/// A bug in kolo (a panic caught at the boundary).
pub const KOLO_ERR_INTERNAL: i32 = -12;
/// An operation did not complete within `KOLO_TIMEOUT`: kolo stopped on
/// every rank it could reach; `kolo_last_error()` carries the desync
/// report.
pub const KOLO_ERR_TIMEOUT: i32 = -13;

thread_local! {
    /// The message of this thread's last failure.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure at the boundary: its status code and message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl Failure {
    /// An invalid argument, with what is wrong.
    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            code: KOLO_ERR_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            code: code_of(&e),
            message: e.to_string(),
        }
    }
}

/// The status code of kolo's error `e`.
pub(crate) fn code_of(e: &Error) -> i32 {
    match e {
        Error::Mismatch { .. } => KOLO_ERR_MISMATCH,
        Error::Remote { .. } => KOLO_ERR_REFUSED,
        Error::Stalled { .. } => KOLO_ERR_STALLED,
        Error::Timeout { .. } => KOLO_ERR_TIMEOUT,
        Error::DuplicateName { .. } => KOLO_ERR_DUPLICATE_NAME,
        Error::ShutDown { .. } => KOLO_ERR_SHUT_DOWN,
        Error::RankFailed { .. } => KOLO_ERR_RANK_FAILED,
        Error::InvalidArgument { .. } | Error::ProcessSet { .. } => KOLO_ERR_INVALID_ARGUMENT,
        Error::Config { .. } | Error::Timeline { .. } | Error::Start { .. } => KOLO_ERR_START,
        _ => KOLO_ERR_COLLECTIVE,
    }
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last(message: &str) {
    // A NUL inside a message would cut it; the text is for people.
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST.with(|last| *last.borrow_mut() = text);
}

/// This thread's last error text (empty before any).
pub(crate) fn last() -> *const c_char {
    LAST.with(|last| last.borrow().as_ptr())
}

/// Runs `body`: its status, or the failure's code with its message left
/// for `kolo_last_error`; a panic is `KOLO_ERR_INTERNAL`.
pub(crate) fn guard(body: impl FnOnce() -> Result<i32, Failure>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(status)) => status,
        Ok(Err(failure)) => {
            set_last(&failure.message);
            failure.code
        }
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic without a message");
            set_last(&format!("internal error in kolo: {text}"));
            KOLO_ERR_INTERNAL
        }
    }
}

/// Runs `body` for a query whose answer is a number, -1 when it fails
/// (no engine) or panics.
pub(crate) fn query(body: impl FnOnce() -> Option<i32>) -> i32 {
    catch_unwind(AssertUnwindSafe(body))
        .ok()
        .flatten()
        .unwrap_or(-1)
}
