//! The mpi backend: this process is one rank of an `mpirun` job
//! (`mpirun -np 4 kolo-bench --backend mpi ...`). Direct mode runs the
//! sweep on a `kolo_mpi::MpiComm` (and, with the baseline, a plain
//! `MPI_Allreduce` on the same buffers); engine mode on a kolo engine from
//! `Kolo::init_mpi`; `--compare` runs direct mode, then hands the same
//! communicator to an engine for the engine sweep. Rank 0 prints the
//! tables. A rank that fails ends the whole job (`MPI_Abort`, naming the
//! rank), since its peers would otherwise wait for it forever.

use super::{Launcher, RankJob};
use crate::baseline::MpiAllreduce;
use crate::cli::Args;
use crate::direct::DirectJob;
use crate::engine::{engine_plan, run_rank, EngineOptions};
use crate::error::BenchError;
use crate::plan::Plan;
use crate::report::Reporter;
use crate::row::{Mode, Row, RunInfo};
use kolo::Kolo;
use kolo_mpi::{MpiComm, ThreadLevel};
use kolo_transport::Topology;
use std::cell::RefCell;

/// This process's rank of an MPI job, for direct-mode jobs.
pub struct MpiLauncher {
    comm: RefCell<MpiComm>,
}

impl MpiLauncher {
    /// Initialises MPI on this thread, asking for `MPI_THREAD_MULTIPLE` (so
    /// that `--compare` may hand the communicator to the engine's thread).
    pub fn init() -> Result<MpiLauncher, BenchError> {
        let comm = MpiComm::init(false).map_err(|e| BenchError::Launch {
            backend: "mpi",
            message: format!("MPI initialisation failed: {e} (run under mpirun)"),
        })?;
        Ok(MpiLauncher {
            comm: RefCell::new(comm),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.borrow().rank()
    }

    /// The thread level MPI granted.
    pub fn thread_level(&self) -> ThreadLevel {
        self.comm.borrow().thread_level()
    }

    /// The plain `MPI_Allreduce` of this (MPI-initialised) process.
    pub fn baseline(&self) -> MpiAllreduce {
        MpiAllreduce::new()
    }

    /// Ends the whole job with `MPI_Abort`, printing `message` and this rank.
    pub fn abort(&self, message: &str) -> ! {
        self.comm.borrow().abort(1, message)
    }

    /// The communicator, for an engine to take over.
    pub fn into_comm(self) -> MpiComm {
        self.comm.into_inner()
    }
}

impl Launcher for MpiLauncher {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn ranks(&self) -> usize {
        self.comm.borrow().size()
    }

    /// Runs `job` on this process's rank: one output, this rank's.
    fn launch<J: RankJob>(&self, job: &J) -> Result<Vec<J::Output>, BenchError> {
        let mut comm = self.comm.try_borrow_mut().map_err(|_| BenchError::Launch {
            backend: "mpi",
            message: "a job is already running on this rank".into(),
        })?;
        Ok(vec![job.run(&mut *comm)?])
    }
}

/// Runs the sweep `args` and `plan` ask for on this process's rank; rank 0
/// prints the tables and returns the rows, the other ranks return none.
pub fn run(args: &Args, plan: &Plan, reporter: &Reporter) -> Result<Vec<Row>, BenchError> {
    // Settings errors are found before MPI starts, identically on every rank.
    let options = EngineOptions::from_args(args)?;
    if args.engine {
        return run_engine(args, plan, &options, reporter);
    }
    let launcher = MpiLauncher::init()?;
    let level = launcher.thread_level();
    if args.compare && level < ThreadLevel::Serialized {
        return Err(BenchError::Launch {
            backend: "mpi",
            message: format!(
                "--compare hands the communicator to the engine's thread, which needs \
                 MPI_THREAD_SERIALIZED or better; MPI granted {level:?}"
            ),
        });
    }
    let rank = launcher.rank();
    let silent = Reporter::silent();
    let reporter = if rank == 0 { reporter } else { &silent };
    reporter.print(&format!(
        "# mpi: {} processes, MPI thread level {level:?}",
        launcher.ranks()
    ))?;
    let info = |mode| RunInfo {
        mode,
        backend: "mpi".into(),
        tensors: 1,
    };
    let baseline = launcher.baseline();
    let job = DirectJob {
        plan,
        info: info(Mode::Direct),
        reporter,
        baseline: plan.baseline.then_some(&baseline),
    };
    let mut rows: Vec<Row> = match launcher.launch(&job) {
        Ok(outputs) => outputs.into_iter().flatten().collect(),
        Err(e) => launcher.abort(&format!("kolo-bench: {e}")),
    };
    if args.compare {
        let kolo = Kolo::start_with_abort(
            launcher.into_comm(),
            options.config.clone(),
            |comm: &mut MpiComm, message: &str| comm.abort(1, message),
        )
        .map_err(|e| BenchError::Launch {
            backend: "mpi",
            message: format!("starting the engine: {e}"),
        })?;
        rows.extend(engine_sweep(
            &kolo,
            plan,
            &options,
            &info(Mode::Engine),
            reporter,
        )?);
    }
    root_finish(rank, args, reporter, rows)
}

/// `--engine`: the sweep through `Kolo::init_mpi`'s engine.
fn run_engine(
    args: &Args,
    plan: &Plan,
    options: &EngineOptions,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    let kolo = Kolo::init_mpi(options.config.clone()).map_err(|e| BenchError::Launch {
        backend: "mpi (engine)",
        message: format!("{e} (run under mpirun)"),
    })?;
    let rank = kolo.rank();
    let silent = Reporter::silent();
    let reporter = if rank == 0 { reporter } else { &silent };
    let supported = match Kolo::mpi_threads_supported() {
        Some(true) => "MPI_THREAD_MULTIPLE",
        Some(false) => "less than MPI_THREAD_MULTIPLE",
        None => "unknown",
    };
    reporter.print(&format!(
        "# mpi: {} processes, MPI thread level {supported}",
        kolo.size()
    ))?;
    let info = RunInfo {
        mode: Mode::Engine,
        backend: "mpi".into(),
        tensors: args.tensors,
    };
    let rows = engine_sweep(&kolo, plan, options, &info, reporter)?;
    root_finish(rank, args, reporter, rows)
}

/// The engine sweep on `kolo`, then a shutdown. A failure on this rank
/// ends the job (`Kolo::abort`, an `MPI_Abort` naming the rank).
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
fn root_finish(
    rank: usize,
    args: &Args,
    reporter: &Reporter,
    rows: Vec<Row>,
) -> Result<Vec<Row>, BenchError> {
    if rank == 0 {
        crate::finish(args, reporter, rows)
    } else {
        Ok(Vec::new())
    }
}
