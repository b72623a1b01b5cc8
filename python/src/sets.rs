//! Process sets for Python: `kolo.process_set(ranks)` made by the members
//! alone, and the engine an operation runs on (the world's, or a set's
//! given as `process_set=`).

use crate::engine;
use crate::errors::raise;
use kolo::Kolo;
use pyo3::prelude::*;
use std::ops::Deref;
use std::sync::Arc;

/// A set of ranks with an engine of its own (see `kolo.process_set`).
#[pyclass(frozen, module = "kolo._kolo")]
pub(crate) struct ProcessSet {
    inner: Arc<kolo::ProcessSet>,
}

#[pymethods]
impl ProcessSet {
    /// The members, as world ranks in ascending order.
    #[getter]
    fn members(&self) -> Vec<usize> {
        self.inner.members().to_vec()
    }

    /// This rank within the set.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// The number of members.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// Shuts the set's engine down on every member (its operations in
    /// flight fail with `kolo.ShutDownError`); the world goes on.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let inner = Arc::clone(&self.inner);
        py.detach(|| inner.shutdown()).map_err(|e| raise(py, e))
    }

    fn __repr__(&self) -> String {
        format!(
            "ProcessSet(members={:?}, rank={})",
            self.inner.members(),
            self.inner.rank()
        )
    }
}

/// Makes the process set of `members` (world ranks): only the members
/// call it, each with the same ranks; returns once all of them did.
#[pyfunction]
pub(crate) fn process_set(py: Python<'_>, members: Vec<usize>) -> PyResult<ProcessSet> {
    let kolo = engine(py)?;
    let set = py
        .detach(|| kolo.process_set(&members))
        .map_err(|e| raise(py, e))?;
    Ok(ProcessSet {
        inner: Arc::new(set),
    })
}

/// The engine an operation runs on.
pub(crate) enum Target {
    World(Arc<Kolo>),
    Set(Arc<kolo::ProcessSet>),
}

impl Deref for Target {
    type Target = Kolo;

    fn deref(&self) -> &Kolo {
        match self {
            Target::World(kolo) => kolo,
            Target::Set(set) => set,
        }
    }
}

/// The set's engine, or the world's where `set` is None.
pub(crate) fn target(py: Python<'_>, set: Option<&ProcessSet>) -> PyResult<Target> {
    match set {
        Some(set) => Ok(Target::Set(Arc::clone(&set.inner))),
        None => engine(py).map(Target::World),
    }
}
