//! kolo-bench: an nccl-tests-style benchmark of kolo's collectives.
//!
//! For each collective (allreduce, allgather, broadcast, reducescatter,
//! alltoall, sendrecv) and each size of a geometric sweep, every rank runs
//! warm-up iterations, a barrier, then timed iterations; rank 0 reports the
//! median over iterations of the slowest rank's time, the algorithm
//! bandwidth (bytes / time) and the bus bandwidth (nccl-tests' factors, so
//! numbers compare across rank counts and with NCCL), and how many
//! elements of the last result differ from a reference computed from the
//! known per-rank inputs. Direct mode calls a backend's
//! [`kolo_transport::Collectives`]; engine mode goes through the whole
//! kolo engine; `--compare` does both in one run and prints the engine's
//! extra cost per operation (with the `mpi` feature, `--backend mpi` under
//! `mpirun`, and a plain `MPI_Allreduce` baseline on the same buffers).
//! Backends are [`launcher::Launcher`]s.
//!
//! ```
//! use clap::Parser;
//! use kolo_bench::{cli::Args, report::Reporter};
//!
//! let args = Args::try_parse_from([
//!     "kolo-bench", "--ranks", "2", "--op", "allreduce,sendrecv",
//!     "--min-bytes", "8", "--max-bytes", "1K", "--iters", "2", "--warmup", "0",
//! ])?;
//! let rows = kolo_bench::run(&args, &Reporter::silent())?;
//! assert_eq!(rows.len(), 16); // 8 B .. 1 KiB, two ops
//! assert!(rows.iter().all(|r| r.wrong == Some(0)));
//! assert_eq!(rows[0].size, 8);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod agreement;
pub mod baseline;
pub mod buffer;
pub mod case;
pub mod cli;
pub mod compare;
pub mod direct;
pub mod engine;
pub mod engine_case;
pub mod error;
pub mod floor;
pub mod json_file;
pub mod launcher;
pub mod memory;
pub mod op;
pub mod plan;
pub mod reference;
pub mod report;
pub mod row;
pub mod size;
pub mod soak;
pub mod stats;

pub use error::BenchError;
pub use op::BenchOp;
pub use row::Row;

use agreement::exchange::{AgreeJob, Proposal};
use cli::Args;
use direct::DirectJob;
use engine::EngineOptions;
use json_file::JsonFile;
use launcher::{BackendKind, Launcher, ThreadsLauncher};
use report::Reporter;
use row::{table_footer, Mode, RunInfo};

/// Runs the benchmark `args` describe, printing through `reporter`, and
/// returns rank 0's rows (also written to `--json FILE` when given). Under
/// MPI every process calls it; the other ranks return no rows.
///
/// Before any rank measures anything, the ranks agree on the plan (see
/// [`agreement`]): ranks given different settings, a host without the
/// memory the buffers need, or a `--json` file rank 0 cannot create stop
/// every rank with the same error.
pub fn run(args: &Args, reporter: &Reporter) -> Result<Vec<Row>, BenchError> {
    let plan = args.plan()?;
    let engine = if args.engine || args.compare {
        let options = EngineOptions::from_args(args)?;
        engine::engine_ops(&plan.ops)?;
        Some(options)
    } else {
        None
    };
    let proposal = Proposal::new(args, &plan, engine);
    let json = JsonFile::new(args.json.clone());
    match args.backend {
        BackendKind::Threads => {
            let launcher = ThreadsLauncher { ranks: args.ranks };
            let job = AgreeJob {
                proposal: &proposal,
                json: &json,
            };
            // Every rank returns the same verdict.
            for verdict in launcher.launch(&job)? {
                verdict?;
            }
            let rows = run_threads(args, &proposal, reporter)?;
            finish(&json, reporter, rows)
        }
        BackendKind::Mpi => run_mpi(args, proposal, json, reporter),
        BackendKind::Ucx => run_ucx(args, proposal, json, reporter),
    }
}

/// Every rank a thread of this process: direct mode, engine mode, or both
/// (`--compare`).
fn run_threads(
    args: &Args,
    proposal: &Proposal,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    let plan = &proposal.plan;
    let info = |mode| RunInfo {
        mode,
        backend: args.backend.name().to_string(),
        tensors: if mode == Mode::Engine {
            args.tensors
        } else {
            1
        },
    };
    let mut rows = Vec::new();
    if proposal.direct {
        let launcher = ThreadsLauncher { ranks: args.ranks };
        let job = DirectJob::new(plan, info(Mode::Direct), reporter);
        rows.extend(launcher.launch(&job)?.into_iter().flatten());
    }
    if let Some(options) = &proposal.engine {
        rows.extend(engine::run_threads(
            args.ranks,
            plan,
            options,
            &info(Mode::Engine),
            reporter,
        )?);
    }
    Ok(rows)
}

#[cfg(feature = "mpi")]
fn run_mpi(
    args: &Args,
    proposal: Proposal,
    json: JsonFile,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    launcher::mpi::run(args, proposal, json, reporter)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: &Args, _: Proposal, _: JsonFile, _: &Reporter) -> Result<Vec<Row>, BenchError> {
    Err(BenchError::MpiNotBuilt)
}

#[cfg(feature = "ucx")]
fn run_ucx(
    args: &Args,
    proposal: Proposal,
    json: JsonFile,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    launcher::ucx::run(args, proposal, json, reporter)
}

#[cfg(not(feature = "ucx"))]
fn run_ucx(_: &Args, _: Proposal, _: JsonFile, _: &Reporter) -> Result<Vec<Row>, BenchError> {
    Err(BenchError::UcxNotBuilt)
}

/// Rank 0's end of a run: the footer, the same-run comparison (when rows
/// of one op and size were measured more than one way), the JSON file
/// (opened before the sweep).
pub(crate) fn finish(
    json: &JsonFile,
    reporter: &Reporter,
    rows: Vec<Row>,
) -> Result<Vec<Row>, BenchError> {
    reporter.print(&table_footer(&rows))?;
    if let Some(table) = compare::comparison_table(&rows) {
        reporter.print(&table)?;
    }
    json.write(&rows)?;
    Ok(rows)
}
