//! The ucx backend: this process is one rank of a job started by
//! `kolo-run` or any launcher that sets torchrun's variables
//! (`kolo-run -n 4 kolo-bench --backend ucx ...`). Direct mode runs the
//! sweep on a `kolo_ucx::UcxComm`; engine mode (and `--compare`'s second
//! half) on a kolo engine started on the same communicator. Every rank
//! agrees on the plan first; a rank that fails later makes its peers'
//! collectives fail naming it (UCX's peer error handling), and kolo-run
//! stops the job.

use super::{engine_sweep, root_finish, RankJob};
use crate::agreement::exchange::{agree_as_process, Proposal};
use crate::cli::Args;
use crate::direct::DirectJob;
use crate::error::BenchError;
use crate::json_file::JsonFile;
use crate::report::Reporter;
use crate::row::{Mode, Row, RunInfo};
use kolo::Kolo;
use kolo_transport::Topology;
use kolo_ucx::UcxComm;

/// Runs the sweep of `proposal` on this process's rank, once every rank
/// agreed on it; rank 0 prints the tables and returns the rows.
pub fn run(
    args: &Args,
    proposal: Proposal,
    json: JsonFile,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    let mut comm = UcxComm::from_env().map_err(|e| BenchError::Launch {
        backend: "ucx",
        message: format!("{e} (start kolo-bench with kolo-run, or set torchrun's variables)"),
    })?;
    agree_as_process(&mut comm, &proposal, &json, None)?;
    let rank = comm.rank();
    let silent = Reporter::silent();
    let reporter = if rank == 0 { reporter } else { &silent };
    reporter.print(&format!("# ucx: {} processes", comm.size()))?;
    let info = |mode, tensors| RunInfo {
        mode,
        backend: "ucx".into(),
        tensors,
    };
    let plan = &proposal.plan;
    let mut rows = Vec::new();
    if proposal.direct {
        rows.extend(DirectJob::new(plan, info(Mode::Direct, 1), reporter).run(&mut comm)?);
    }
    if let Some(options) = &proposal.engine {
        let kolo = Kolo::start(comm, options.config.clone()).map_err(|e| BenchError::Launch {
            backend: "ucx",
            message: format!("starting the engine: {e}"),
        })?;
        let tensors = if args.compare { 1 } else { args.tensors };
        rows.extend(engine_sweep(
            &kolo,
            plan,
            options,
            &info(Mode::Engine, tensors),
            reporter,
        )?);
    }
    root_finish(rank, &json, reporter, rows)
}
