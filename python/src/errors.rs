//! kolo's errors as Python exceptions, with the same text. The classes
//! live in `kolo/errors.py` (so they can also derive from Python's own:
//! an invalid argument is a `ValueError` too, a timeout a `TimeoutError`).

use kolo::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The exception for kolo's error `e`.
pub(crate) fn raise(py: Python<'_>, e: Error) -> PyErr {
    let class = match &e {
        Error::Mismatch { .. } => "MismatchError",
        Error::Stalled { .. } => "StalledError",
        Error::Timeout { .. } => "OperationTimeoutError",
        Error::ShutDown { .. } => "ShutDownError",
        Error::RankFailed { .. } => "RankFailedError",
        Error::InvalidArgument { .. } | Error::DuplicateName { .. } | Error::ProcessSet { .. } => {
            "InvalidArgumentError"
        }
        Error::Config { .. } | Error::Start { .. } => "StartError",
        _ => "KoloError",
    };
    make(py, class, e.to_string())
}

/// An invalid-argument exception with `message`.
pub(crate) fn invalid(py: Python<'_>, message: String) -> PyErr {
    make(py, "InvalidArgumentError", message)
}

/// The exception for a call before `kolo.init()`.
pub(crate) fn not_initialized(py: Python<'_>) -> PyErr {
    make(
        py,
        "NotInitializedError",
        "kolo is not initialised: call kolo.init() first".into(),
    )
}

/// A wait's timeout that passed, the operation still in flight.
pub(crate) fn timed_out(py: Python<'_>, what: String) -> PyErr {
    make(py, "TimeoutError", what)
}

/// An instance of `kolo.errors.<class>` with `message`.
fn make(py: Python<'_>, class: &str, message: String) -> PyErr {
    let made = py
        .import("kolo.errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call1((message.clone(),)));
    match made {
        Ok(exception) => PyErr::from_value(exception),
        // kolo.errors missing (the module used without its package).
        Err(_) => PyRuntimeError::new_err(message),
    }
}
