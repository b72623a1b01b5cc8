//! The collectives, each in two forms: `*_async` returns a [`Handle`],
//! the plain one waits (GIL released) and returns the output. Tensors are
//! taken in without a copy (see [`crate::intake`]); in-place operations
//! write into the caller's array or tensor.

use crate::errors::raise;
use crate::handle::{Handle, Output};
use crate::intake::{intake, Held, Intake};
use crate::sets::{target, ProcessSet};
use kolo::raw::RawHandle;
use kolo::{Compression, Kolo, ReduceOp, ReduceOptions, TensorGroup};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// An operation submitted, with what it holds.
struct Submitted {
    raw: RawHandle,
    held: Vec<Held>,
}

/// Submits through `submit` (the engine's raw call), keeping `held` (what
/// the tensors' memory needs) with the handle.
fn submit(
    py: Python<'_>,
    set: Option<&ProcessSet>,
    held: Vec<Held>,
    submit: impl FnOnce(&Kolo) -> Result<RawHandle, kolo::Error>,
) -> PyResult<Submitted> {
    let kolo = target(py, set)?;
    let raw = submit(&kolo).map_err(|e| raise(py, e))?;
    Ok(Submitted { raw, held })
}

/// Waits for `submitted` (GIL released): its output, if any.
fn finish(py: Python<'_>, submitted: Submitted) -> PyResult<Option<Py<Output>>> {
    let Submitted { raw, held } = submitted;
    let result = py.detach(|| raw.wait());
    drop(held);
    match result {
        Ok(Some(output)) => Ok(Some(Py::new(py, Output::from_raw(output))?)),
        Ok(None) => Ok(None),
        Err(e) => Err(raise(py, e)),
    }
}

/// The options of a reduction: `op` a code of `kolo.Sum`, `kolo.Average`...,
/// `compression` a name of `kolo.Compression` (`"none"`, `"fp16"`, `"bf16"`).
fn reduce_options(
    name: &str,
    op: usize,
    prescale: f64,
    postscale: f64,
    compression: &str,
) -> PyResult<ReduceOptions> {
    let op = ReduceOp::ALL.get(op).copied().ok_or_else(|| {
        PyValueError::new_err(format!(
            "tensor '{name}': unknown reduce op {op} (kolo.Sum = 0 ... kolo.Product = 4)"
        ))
    })?;
    let compression = Compression::from_name(compression).ok_or_else(|| {
        PyValueError::new_err(format!(
            "tensor '{name}': unknown compression {compression:?} (kolo.Compression.none, \
             .fp16 or .bf16)"
        ))
    })?;
    Ok(ReduceOptions::new(op)
        .prescale(prescale)
        .postscale(postscale)
        .compression(compression))
}

#[allow(clippy::too_many_arguments)] // the Python call's keywords
fn allreduce_submit(
    tensor: &Bound<'_, PyAny>,
    name: &str,
    op: usize,
    prescale: f64,
    postscale: f64,
    stream: usize,
    compression: &str,
    process_set: Option<&ProcessSet>,
) -> PyResult<Submitted> {
    let py = tensor.py();
    let options = reduce_options(name, op, prescale, postscale, compression)?;
    let Intake { tensor, held } = intake(tensor, name, true, stream)?;
    // SAFETY: `held` keeps the tensor's memory alive until the operation
    // completed (waited for here, or by the handle, whose drop hands it
    // to the completion).
    submit(py, process_set, held, |k| unsafe {
        k.allreduce_raw(name, &tensor, options)
    })
}

/// Reduces `tensor` across all ranks, in place.
#[allow(clippy::too_many_arguments)] // the Python call's keywords
#[pyfunction]
#[pyo3(signature = (tensor, name, op=0, prescale=1.0, postscale=1.0, stream=0, compression="none", process_set=None))]
pub(crate) fn allreduce(
    tensor: &Bound<'_, PyAny>,
    name: &str,
    op: usize,
    prescale: f64,
    postscale: f64,
    stream: usize,
    compression: &str,
    process_set: Option<PyRef<'_, ProcessSet>>,
) -> PyResult<()> {
    let submitted = allreduce_submit(
        tensor,
        name,
        op,
        prescale,
        postscale,
        stream,
        compression,
        process_set.as_deref(),
    )?;
    finish(tensor.py(), submitted).map(drop)
}

/// [`allreduce`], returning a handle.
#[allow(clippy::too_many_arguments)] // the Python call's keywords
#[pyfunction]
#[pyo3(signature = (tensor, name, op=0, prescale=1.0, postscale=1.0, stream=0, compression="none", process_set=None))]
pub(crate) fn allreduce_async(
    tensor: &Bound<'_, PyAny>,
    name: &str,
    op: usize,
    prescale: f64,
    postscale: f64,
    stream: usize,
    compression: &str,
    process_set: Option<PyRef<'_, ProcessSet>>,
) -> PyResult<Handle> {
    let Submitted { raw, held } = allreduce_submit(
        tensor,
        name,
        op,
        prescale,
        postscale,
        stream,
        compression,
        process_set.as_deref(),
    )?;
    Ok(Handle::new(raw, held))
}

/// Reduces `tensors` (one data type and device) in place, fused: every
/// rank passes the same `names` in the same order.
#[pyfunction]
#[pyo3(signature = (tensors, names, op=0, prescale=1.0, postscale=1.0, stream=0, compression="none", process_set=None))]
#[allow(clippy::too_many_arguments)] // the Python call's keywords
pub(crate) fn grouped_allreduce_async(
    py: Python<'_>,
    tensors: Vec<Bound<'_, PyAny>>,
    names: Vec<String>,
    op: usize,
    prescale: f64,
    postscale: f64,
    stream: usize,
    compression: &str,
    process_set: Option<PyRef<'_, ProcessSet>>,
) -> PyResult<Handle> {
    if tensors.len() != names.len() {
        return Err(PyValueError::new_err(format!(
            "grouped allreduce: {} tensors but {} names",
            tensors.len(),
            names.len()
        )));
    }
    let first = names.first().cloned().unwrap_or_default();
    let options = reduce_options(&first, op, prescale, postscale, compression)?;
    let group = TensorGroup::new(&names).map_err(|e| raise(py, e))?;
    let mut raw = Vec::with_capacity(tensors.len());
    let mut held = Vec::with_capacity(2 * tensors.len());
    for (tensor, name) in tensors.iter().zip(&names) {
        let taken = intake(tensor, name, true, stream)?;
        raw.push(taken.tensor);
        held.extend(taken.held);
    }
    // SAFETY: as in `allreduce_submit`, for every tensor.
    let Submitted { raw, held } = submit(py, process_set.as_deref(), held, |k| unsafe {
        k.allreduce_group_raw(&group, &raw, options)
    })?;
    Ok(Handle::new(raw, held))
}

/// Copies rank `root`'s `tensor` into every rank's `tensor`.
#[pyfunction]
#[pyo3(signature = (tensor, name, root=0, stream=0, process_set=None))]
pub(crate) fn broadcast_async(
    tensor: &Bound<'_, PyAny>,
    name: &str,
    root: usize,
    stream: usize,
    process_set: Option<PyRef<'_, ProcessSet>>,
) -> PyResult<Handle> {
    let py = tensor.py();
    let Intake { tensor, held } = intake(tensor, name, true, stream)?;
    // SAFETY: as in `allreduce_submit`.
    let Submitted { raw, held } = submit(py, process_set.as_deref(), held, |k| unsafe {
        k.broadcast_raw(name, &tensor, root)
    })?;
    Ok(Handle::new(raw, held))
}

/// Concatenates every rank's `tensor` along the first dimension; the
/// handle's output holds the result.
#[pyfunction]
#[pyo3(signature = (tensor, name, stream=0, process_set=None))]
pub(crate) fn allgather_async(
    tensor: &Bound<'_, PyAny>,
    name: &str,
    stream: usize,
    process_set: Option<PyRef<'_, ProcessSet>>,
) -> PyResult<Handle> {
    let py = tensor.py();
    let Intake { tensor, held } = intake(tensor, name, false, stream)?;
    // SAFETY: as in `allreduce_submit` (the input is only read).
    let Submitted { raw, held } = submit(py, process_set.as_deref(), held, |k| unsafe {
        k.allgather_raw(name, &tensor)
    })?;
    Ok(Handle::new(raw, held))
}

/// Reduces `input` across all ranks into this rank's share of its rows,
/// `output`.
#[pyfunction]
#[pyo3(signature = (input, output, name, op=0, prescale=1.0, postscale=1.0, stream=0, process_set=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_scatter_async(
    input: &Bound<'_, PyAny>,
    output: &Bound<'_, PyAny>,
    name: &str,
    op: usize,
    prescale: f64,
    postscale: f64,
    stream: usize,
    process_set: Option<PyRef<'_, ProcessSet>>,
) -> PyResult<Handle> {
    let py = input.py();
    let options = reduce_options(name, op, prescale, postscale, "none")?;
    let input = intake(input, name, false, stream)?;
    let output = intake(output, name, true, stream)?;
    let mut held = input.held;
    held.extend(output.held);
    // SAFETY: as in `allreduce_submit`, for both tensors.
    let Submitted { raw, held } = submit(py, process_set.as_deref(), held, |k| unsafe {
        k.reduce_scatter_raw(name, &input.tensor, &output.tensor, options)
    })?;
    Ok(Handle::new(raw, held))
}

/// Sends `splits[p]` rows of `tensor` to each rank p (None: an even
/// split); the handle's output holds what arrived (its `splits`: the
/// rows from each rank).
#[pyfunction]
#[pyo3(signature = (tensor, name, splits=None, stream=0, process_set=None))]
pub(crate) fn alltoall_async(
    tensor: &Bound<'_, PyAny>,
    name: &str,
    splits: Option<Vec<usize>>,
    stream: usize,
    process_set: Option<PyRef<'_, ProcessSet>>,
) -> PyResult<Handle> {
    let py = tensor.py();
    let splits = splits.unwrap_or_default();
    let Intake { tensor, held } = intake(tensor, name, false, stream)?;
    // SAFETY: as in `allreduce_submit` (the input is only read).
    let Submitted { raw, held } = submit(py, process_set.as_deref(), held, |k| unsafe {
        k.alltoall_raw(name, &tensor, &splits)
    })?;
    Ok(Handle::new(raw, held))
}

/// Blocks until every rank entered the barrier (GIL released).
#[pyfunction]
#[pyo3(signature = (process_set=None))]
pub(crate) fn barrier(py: Python<'_>, process_set: Option<PyRef<'_, ProcessSet>>) -> PyResult<()> {
    let kolo = target(py, process_set.as_deref())?;
    py.detach(|| kolo.barrier()).map_err(|e| raise(py, e))
}

/// Horovod's join: this rank has no more batches; returns the last rank
/// to join (GIL released).
#[pyfunction]
#[pyo3(signature = (process_set=None))]
pub(crate) fn join(py: Python<'_>, process_set: Option<PyRef<'_, ProcessSet>>) -> PyResult<usize> {
    let kolo = target(py, process_set.as_deref())?;
    py.detach(|| kolo.join()).map_err(|e| raise(py, e))
}
