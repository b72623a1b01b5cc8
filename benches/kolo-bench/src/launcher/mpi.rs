//! The mpi backend: this process is one rank of an `mpirun` job
//! (`mpirun -np 4 kolo-bench --backend mpi ...`). Direct mode runs the
//! sweep on a `kolo_mpi::MpiComm` (and, with the baseline, a plain
//! `MPI_Allreduce` on the same buffers); engine mode on a kolo engine from
//! `Kolo::init_mpi`; `--compare` runs direct mode, then hands the same
//! communicator to an engine for the engine sweep. Rank 0 prints the
//! tables. Before the sweep every rank agrees on the plan (different
//! arguments per rank are an error on all of them); a rank that fails
//! during the sweep ends the whole job (`MPI_Abort`, naming the rank),
//! since its peers would otherwise wait for it forever.

use super::{engine_sweep, root_finish, Launcher, RankJob};
use crate::agreement::exchange::{agree_as_process, Proposal};
use crate::baseline::MpiAllreduce;
use crate::cli::Args;
use crate::direct::DirectJob;
use crate::error::BenchError;
use crate::json_file::JsonFile;
use crate::report::Reporter;
use crate::row::{Mode, Row, RunInfo};
use kolo::Kolo;
use kolo_mpi::{MpiComm, ThreadLevel};
use kolo_transport::Topology;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

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

    /// Agrees with every rank on `proposal` (see
    /// [`agree_as_process`]).
    pub fn agree(
        &self,
        proposal: &Proposal,
        json: &JsonFile,
        local: Option<BenchError>,
    ) -> Result<(), BenchError> {
        let mut comm = self.comm.try_borrow_mut().map_err(|_| BenchError::Launch {
            backend: "mpi",
            message: "a job is already running on this rank".into(),
        })?;
        agree_as_process(&mut *comm, proposal, json, local)
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

/// Runs the sweep of `proposal` on this process's rank, once every rank
/// agreed on it; rank 0 prints the tables and returns the rows (writing
/// them to `json`), the other ranks return none.
pub fn run(
    args: &Args,
    proposal: Proposal,
    json: JsonFile,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    if args.engine {
        return run_engine(args, proposal, json, reporter);
    }
    let launcher = MpiLauncher::init()?;
    let level = launcher.thread_level();
    // Told to every rank through the agreement, so that none is left
    // waiting for this one.
    let local = (args.compare && level < ThreadLevel::Serialized).then(|| BenchError::Launch {
        backend: "mpi",
        message: format!(
            "--compare hands the communicator to the engine's thread, which needs \
             MPI_THREAD_SERIALIZED or better; MPI granted {level:?}"
        ),
    });
    launcher.agree(&proposal, &json, local)?;
    let plan = &proposal.plan;
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
    if let Some(options) = proposal.engine.as_ref().filter(|_| args.compare) {
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
            options,
            &info(Mode::Engine),
            reporter,
        )?);
    }
    root_finish(rank, &json, reporter, rows)
}

/// `--engine`: the sweep through an engine on MPI. MPI is initialised on
/// the engine's thread, which makes every MPI call (as `Kolo::init_mpi`
/// does, so `KOLO_MPI_THREADS_DISABLE=1` is honoured), and the ranks agree
/// there on the raw communicator before the engine starts: a rank given
/// other arguments cannot leave the engines waiting for each other.
fn run_engine(
    args: &Args,
    proposal: Proposal,
    json: JsonFile,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    let Some(options) = proposal.engine.clone() else {
        return Err(BenchError::InvalidArgs(
            "--engine without engine settings".into(),
        ));
    };
    let json = Arc::new(json);
    let refused: Arc<Mutex<Option<BenchError>>> = Arc::default();
    let (agreed, file, why) = (proposal.clone(), Arc::clone(&json), Arc::clone(&refused));
    let disable = options.config.mpi_threads_disable;
    let started = Kolo::start_on_thread(
        move || {
            let mut comm = MpiComm::init(disable).map_err(|e| kolo::Error::Start {
                message: format!("MPI initialisation failed: {e}"),
            })?;
            agree_as_process(&mut comm, &agreed, &file, None).map_err(|e| {
                let message = e.to_string();
                *why.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                kolo::Error::Start { message }
            })?;
            Ok(comm)
        },
        options.config.clone(),
        |comm: &mut MpiComm, message: &str| comm.abort(1, message),
    );
    let kolo = started.map_err(|e| {
        let refusal = refused.lock().unwrap_or_else(|p| p.into_inner()).take();
        refusal.unwrap_or_else(|| BenchError::Launch {
            backend: "mpi (engine)",
            message: format!("{e} (run under mpirun)"),
        })
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
    let rows = engine_sweep(&kolo, &proposal.plan, &options, &info, reporter)?;
    root_finish(rank, &json, reporter, rows)
}
