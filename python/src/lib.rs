//! The native module of the `kolo` Python package (`kolo._kolo`): kolo's
//! engine for Python, on numpy arrays through the buffer protocol and on
//! torch tensors (CPU and CUDA) through DLPack, without copies; waits
//! release the GIL. The Python package (`python/kolo/`) wraps it in
//! Horovod's API (`kolo.allreduce`, `kolo.torch.DistributedOptimizer`)
//! and a torch.distributed backend; see its docstrings.

mod dlpack;
mod errors;
mod handle;
mod intake;
mod launch;
mod ops;
mod sets;

use errors::{not_initialized, raise};
use kolo::Kolo;
use parking_lot::RwLock;
use pyo3::prelude::*;
use std::sync::Arc;

/// The engine `init()` started in this process.
static ENGINE: RwLock<Option<Arc<Kolo>>> = RwLock::new(None);

/// The engine, or `kolo.NotInitializedError`.
pub(crate) fn engine(py: Python<'_>) -> PyResult<Arc<Kolo>> {
    ENGINE.read().clone().ok_or_else(|| not_initialized(py))
}

/// Starts this process's engine as the environment says (`KOLO_*`; the
/// launcher's variables pick the backend: torchrun's or kolo-run's over
/// UCX, mpirun's over MPI, a process alone on threads; a GPU engine where
/// the host has a GPU for each of its ranks). A second call while it runs does nothing.
#[pyfunction]
fn init(py: Python<'_>) -> PyResult<()> {
    if ENGINE.read().is_some() {
        return Ok(());
    }
    let started = py.detach(|| {
        let config = kolo::Config::from_env()?;
        kolo::init_logging(config.log_level);
        Kolo::init(config)
    });
    let kolo = started.map_err(|e| raise(py, e))?;
    let mut engine = ENGINE.write();
    if engine.is_none() {
        *engine = Some(Arc::new(kolo));
    }
    Ok(())
}

/// Shuts the engine down on every rank (operations in flight fail with
/// `kolo.ShutDownError`); nothing without an engine.
#[pyfunction]
fn shutdown(py: Python<'_>) -> PyResult<()> {
    let taken = ENGINE.write().take();
    if let Some(kolo) = taken {
        py.detach(|| kolo.shutdown()).map_err(|e| raise(py, e))?;
    }
    Ok(())
}

/// True between `init()` and `shutdown()`.
#[pyfunction]
fn is_initialized() -> bool {
    ENGINE.read().is_some()
}

/// This rank.
#[pyfunction]
fn rank(py: Python<'_>) -> PyResult<usize> {
    Ok(engine(py)?.rank())
}

/// The number of ranks.
#[pyfunction]
fn size(py: Python<'_>) -> PyResult<usize> {
    Ok(engine(py)?.size())
}

/// This rank among the ranks of its host.
#[pyfunction]
fn local_rank(py: Python<'_>) -> PyResult<usize> {
    Ok(engine(py)?.local_rank())
}

/// The number of ranks on this host.
#[pyfunction]
fn local_size(py: Python<'_>) -> PyResult<usize> {
    Ok(engine(py)?.local_size())
}

/// The CUDA device the engine reduces on, or None (a host engine).
#[pyfunction]
fn gpu(py: Python<'_>) -> PyResult<Option<usize>> {
    Ok(engine(py)?.gpu())
}

/// Whether MPI granted `MPI_THREAD_MULTIPLE` (False off MPI).
#[pyfunction]
fn mpi_threads_supported(py: Python<'_>) -> PyResult<bool> {
    engine(py)?;
    Ok(Kolo::mpi_threads_supported().unwrap_or(false))
}

/// Frees this rank's fusion buffers now (host and GPU), as
/// `torch.cuda.empty_cache()` empties PyTorch's cache, and returns the
/// bytes freed; the next fused operation allocates again. Local to this
/// rank; operations in flight are not disturbed.
#[pyfunction]
fn release_buffers(py: Python<'_>) -> PyResult<usize> {
    let kolo = engine(py)?;
    py.detach(|| kolo.release_buffers())
        .map_err(|e| raise(py, e))
}

#[pymodule]
fn _kolo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(rank, m)?)?;
    m.add_function(wrap_pyfunction!(size, m)?)?;
    m.add_function(wrap_pyfunction!(local_rank, m)?)?;
    m.add_function(wrap_pyfunction!(local_size, m)?)?;
    m.add_function(wrap_pyfunction!(gpu, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_threads_supported, m)?)?;
    m.add_function(wrap_pyfunction!(release_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(ops::allreduce, m)?)?;
    m.add_function(wrap_pyfunction!(ops::allreduce_async, m)?)?;
    m.add_function(wrap_pyfunction!(ops::grouped_allreduce_async, m)?)?;
    m.add_function(wrap_pyfunction!(ops::broadcast_async, m)?)?;
    m.add_function(wrap_pyfunction!(ops::allgather_async, m)?)?;
    m.add_function(wrap_pyfunction!(ops::reduce_scatter_async, m)?)?;
    m.add_function(wrap_pyfunction!(ops::alltoall_async, m)?)?;
    m.add_function(wrap_pyfunction!(ops::barrier, m)?)?;
    m.add_function(wrap_pyfunction!(ops::join, m)?)?;
    m.add_function(wrap_pyfunction!(sets::process_set, m)?)?;
    m.add_function(wrap_pyfunction!(launch::run_job, m)?)?;
    m.add_function(wrap_pyfunction!(launch::launch, m)?)?;
    m.add_class::<handle::Handle>()?;
    m.add_class::<handle::Output>()?;
    m.add_class::<sets::ProcessSet>()?;
    Ok(())
}
