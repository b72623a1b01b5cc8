//! How the ranks of a run are started: one module per backend, each a
//! [`Launcher`] that runs a [`RankJob`] on every rank it hosts.
//!
//! The job is generic over the backend's communicator, so the benchmark is
//! written once against kolo-transport's traits; a backend is one more
//! module here and one more [`BackendKind`] variant. Threads host every
//! rank in this process; MPI (the `mpi` feature) is one process per rank
//! under `mpirun`, each hosting its own rank.

#[cfg(feature = "mpi")]
pub mod mpi;
mod threads;
#[cfg(feature = "ucx")]
pub mod ucx;

#[cfg(feature = "mpi")]
pub use mpi::MpiLauncher;
pub use threads::ThreadsLauncher;

use crate::error::BenchError;
use kolo_transport::Backend;
#[cfg(any(feature = "mpi", feature = "ucx"))]
use {
    crate::engine::{engine_plan, run_rank, EngineOptions},
    crate::json_file::JsonFile,
    crate::plan::Plan,
    crate::report::Reporter,
    crate::row::{Row, RunInfo},
    kolo::Kolo,
};

/// The work every rank does. `run` is called once per hosted rank, each on
/// its own communicator, all concurrently.
pub trait RankJob: Sync {
    /// What one rank returns (the rows, on rank 0).
    type Output: Send;

    /// Runs this rank's share of the job.
    fn run<B: Backend>(&self, comm: &mut B) -> Result<Self::Output, BenchError>;
}

/// Starts ranks on one backend.
pub trait Launcher {
    /// The backend's name, as printed in the table and the JSON rows.
    fn name(&self) -> &'static str;

    /// The number of ranks of the communicator.
    fn ranks(&self) -> usize;

    /// Runs `job` on every rank this process hosts and returns their
    /// outputs in rank order (all ranks for threads; this process's rank
    /// for a one-process-per-rank backend).
    fn launch<J: RankJob>(&self, job: &J) -> Result<Vec<J::Output>, BenchError>;
}

/// The backends `--backend` can pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// In-process ranks, one thread each, on shared memory (kolo-threads).
    Threads,
    /// One process per rank under `mpirun` (kolo-mpi; the `mpi` feature).
    Mpi,
    /// One process per rank started by `kolo-run` (or any launcher that
    /// sets torchrun's variables), over UCX (kolo-ucx; the `ucx` feature).
    Ucx,
}

impl BackendKind {
    /// The name used on the command line and in the rows.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Threads => "threads",
            BackendKind::Mpi => "mpi",
            BackendKind::Ucx => "ucx",
        }
    }
}

/// The engine sweep on `kolo` (one process per rank), then a shutdown. A
/// failure on this rank aborts it (under MPI an `MPI_Abort` naming the
/// rank; elsewhere its peers fail naming it).
#[cfg(any(feature = "mpi", feature = "ucx"))]
fn engine_sweep(
    kolo: &Kolo,
    plan: &Plan,
    options: &EngineOptions,
    info: &RunInfo,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    let result = engine_plan(plan, options, reporter)
        .and_then(|plan| run_rank(kolo, &plan, options, info, reporter));
    match result {
        Ok(rows) => {
            kolo.shutdown().map_err(|source| BenchError::Engine {
                op: "shutdown",
                bytes: 0,
                rank: kolo.rank(),
                source,
            })?;
            Ok(rows)
        }
        Err(e) => {
            kolo.abort(&format!("kolo-bench: {e}"));
            Err(e)
        }
    }
}

/// Rank 0 ends the run (footer, comparison, JSON); the others return no
/// rows.
#[cfg(any(feature = "mpi", feature = "ucx"))]
fn root_finish(
    rank: usize,
    json: &JsonFile,
    reporter: &Reporter,
    rows: Vec<Row>,
) -> Result<Vec<Row>, BenchError> {
    if rank == 0 {
        crate::finish(json, reporter, rows)
    } else {
        Ok(Vec::new())
    }
}
