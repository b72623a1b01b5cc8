//! `Handle`: an operation in flight, as Python holds it (`poll`, `wait`
//! with the GIL released), and `Output`: what an allgather or alltoall
//! delivered, handed over once through DLPack (`numpy.from_dlpack`,
//! `torch.from_dlpack`) without a copy.

use crate::dlpack;
use crate::errors::{raise, timed_out};
use crate::intake::Held;
use kolo::raw::{RawHandle, RawOutput};
use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::time::Duration;

/// Where a handle stands.
enum State {
    /// In flight, with what its memory needs kept.
    Pending { raw: RawHandle, held: Vec<Held> },
    /// Being waited for by a thread that took the raw handle out.
    Waiting,
    /// Completed: its output (if any) or its error.
    Done(Result<Option<Py<Output>>, kolo::Error>),
    /// Its result goes (or went) to a done-callback.
    Reported,
}

/// An operation in flight: `poll()` (True once completed), `wait(timeout)`
/// (its output, or None for in-place operations; raises its error).
#[pyclass(module = "kolo._kolo", frozen)]
pub struct Handle {
    state: Mutex<State>,
}

impl Handle {
    pub(crate) fn new(raw: RawHandle, held: Vec<Held>) -> Handle {
        Handle {
            state: Mutex::new(State::Pending { raw, held }),
        }
    }

    /// Records a completed result (the buffers' holds dropped).
    fn finish(py: Python<'_>, result: Result<Option<RawOutput>, kolo::Error>) -> PyResult<State> {
        Ok(State::Done(match result {
            Ok(Some(output)) => Ok(Some(Py::new(py, Output::from_raw(output))?)),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        }))
    }

    /// The result of a completed handle, as Python sees it.
    fn result(py: Python<'_>, state: &State) -> PyResult<Option<Py<Output>>> {
        match state {
            State::Done(Ok(output)) => Ok(output.as_ref().map(|o| o.clone_ref(py))),
            State::Done(Err(e)) => Err(raise(py, e.clone())),
            State::Reported => Err(PyRuntimeError::new_err(
                "the operation's result went to its done-callback",
            )),
            _ => Err(PyRuntimeError::new_err("the operation is still in flight")),
        }
    }
}

/// Waits for `raw` with the GIL released; the result, or `None` when
/// `timeout` passed first.
fn wait_detached_for(
    py: Python<'_>,
    raw: &mut RawHandle,
    timeout: Option<Duration>,
) -> Option<Result<Option<RawOutput>, kolo::Error>> {
    py.detach(|| raw.wait_timeout(timeout.unwrap_or(Duration::MAX)))
}

#[pymethods]
impl Handle {
    /// True once the operation completed (its error, if any, is raised
    /// by `wait`).
    fn poll(&self, py: Python<'_>) -> PyResult<bool> {
        let mut state = self.state.lock();
        if let State::Pending { raw, .. } = &mut *state {
            match raw.poll() {
                Some(result) => *state = Handle::finish(py, result)?,
                None => return Ok(false),
            }
        }
        Ok(matches!(*state, State::Done(_)))
    }

    /// Waits until the operation completed, at most `timeout` seconds
    /// (None: no bound), with the GIL released: its output (allgather,
    /// alltoall) or None; raises its error, or `kolo.TimeoutError` with the
    /// operation still in flight.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<Output>>> {
        let bound = match timeout {
            Some(t) if t.is_finite() && t >= 0.0 => Some(Duration::from_secs_f64(t)),
            _ => None,
        };
        let taken = {
            let mut state = self.state.lock();
            match std::mem::replace(&mut *state, State::Waiting) {
                State::Pending { raw, held } => Some((raw, held)),
                State::Waiting => {
                    *state = State::Waiting;
                    return Err(PyRuntimeError::new_err(
                        "the handle is being waited for on another thread",
                    ));
                }
                done => {
                    *state = done;
                    None
                }
            }
        };
        if let Some((mut raw, held)) = taken {
            let result = wait_detached_for(py, &mut raw, bound);
            let mut state = self.state.lock();
            match result {
                Some(result) => {
                    drop(held);
                    *state = Handle::finish(py, result)?;
                }
                None => {
                    *state = State::Pending { raw, held };
                    return Err(timed_out(
                        py,
                        format!("the operation did not complete within {timeout:?} s; it goes on"),
                    ));
                }
            }
        }
        Handle::result(py, &self.state.lock())
    }

    /// Calls `callback(error, output)` once the operation completed, on
    /// kolo's callback thread (never the engine's): `error` is None or the
    /// exception `wait` would raise, `output` the allgather's or
    /// alltoall's output or None. The handle can no longer be waited for.
    fn add_done_callback(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        let state = std::mem::replace(&mut *self.state.lock(), State::Reported);
        let (raw, held) = match state {
            State::Pending { raw, held } => (raw, held),
            State::Done(result) => {
                let (error, output) = match result {
                    Ok(output) => (None, output),
                    Err(e) => (Some(raise(py, e).into_value(py)), None),
                };
                return callback.call1(py, (error, output)).map(drop);
            }
            other => {
                *self.state.lock() = other;
                return Err(PyRuntimeError::new_err(
                    "the handle is being waited for, or reports to a callback already",
                ));
            }
        };
        raw.on_complete(move |result| {
            Python::attach(|py| {
                drop(held);
                let called = match result {
                    Ok(output) => output
                        .map(|o| Py::new(py, Output::from_raw(o)))
                        .transpose()
                        .and_then(|output| callback.call1(py, (py.None(), output))),
                    Err(e) => callback.call1(py, (raise(py, e).into_value(py), py.None())),
                };
                if let Err(e) = called {
                    // Nobody waits on this thread: Python reports it.
                    e.write_unraisable(py, Some(callback.bind(py)));
                }
            })
        });
        Ok(())
    }

    fn __repr__(&self) -> String {
        match &*self.state.lock() {
            State::Pending { raw, .. } => format!("<kolo.Handle {raw:?}>"),
            State::Waiting => "<kolo.Handle being waited for>".into(),
            State::Done(Ok(_)) => "<kolo.Handle done>".into(),
            State::Done(Err(e)) => format!("<kolo.Handle failed: {e}>"),
            State::Reported => "<kolo.Handle reported to its callback>".into(),
        }
    }
}

impl Drop for Handle {
    /// An operation dropped in flight still completes on every rank: its
    /// memory is held until then, off this thread.
    fn drop(&mut self) {
        let state = std::mem::replace(self.state.get_mut(), State::Waiting);
        if let State::Pending { raw, held } = state {
            if !raw.is_complete() {
                raw.on_complete(move |_| drop(held));
            }
        }
    }
}

/// What an allgather or alltoall delivered to this rank, in memory kolo
/// owns: hand it to `numpy.from_dlpack` or `torch.from_dlpack` (once).
#[pyclass(module = "kolo._kolo", frozen)]
pub struct Output {
    output: Mutex<Option<RawOutput>>,
    device: Option<usize>,
    shape: Vec<usize>,
    splits: Vec<usize>,
}

impl Output {
    pub(crate) fn from_raw(output: RawOutput) -> Output {
        Output {
            device: output.device(),
            shape: output.shape().to_vec(),
            splits: output.splits().to_vec(),
            output: Mutex::new(Some(output)),
        }
    }
}

#[pymethods]
impl Output {
    /// The output's shape.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    /// The rows that came from each rank (alltoall; empty otherwise).
    #[getter]
    fn splits(&self) -> Vec<usize> {
        self.splits.clone()
    }

    /// DLPack's device: `(1, 0)` for host memory, `(2, gpu)` for CUDA.
    fn __dlpack_device__(&self) -> (i32, i32) {
        match self.device {
            Some(gpu) => (dlpack::CUDA, gpu as i32),
            None => (dlpack::CPU, 0),
        }
    }

    /// The output as a DLPack capsule (legacy `dltensor`, which every
    /// consumer reads); the memory is ready for any stream once the
    /// operation completed, so `stream` asks for nothing.
    #[pyo3(signature = (stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Py<PyAny>>,
        max_version: Option<Py<PyAny>>,
        dl_device: Option<Py<PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version, dl_device, copy);
        let output = self.output.lock().take().ok_or_else(|| {
            PyRuntimeError::new_err(
                "this kolo output was handed over already (from_dlpack takes it once)",
            )
        })?;
        let managed = dlpack::export(output);
        // SAFETY: a fresh capsule over the exported tensor; its destructor
        // frees the tensor unless a consumer took it. GIL held.
        let capsule = unsafe {
            ffi::PyCapsule_New(
                managed.cast(),
                dlpack::CAPSULE.as_ptr(),
                Some(dlpack::drop_capsule),
            )
        };
        if capsule.is_null() {
            // SAFETY: never handed to anyone: freed here, once.
            unsafe { dlpack::drop_managed(managed) };
            return Err(PyErr::fetch(py));
        }
        // SAFETY: a new reference, owned from here on.
        Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
    }
}
