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
//! kolo engine. Backends are [`launcher::Launcher`]s.
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

pub mod case;
pub mod cli;
pub mod direct;
pub mod engine;
pub mod engine_case;
pub mod error;
pub mod launcher;
pub mod op;
pub mod plan;
pub mod reference;
pub mod report;
pub mod row;
pub mod size;
pub mod stats;

pub use error::BenchError;
pub use op::BenchOp;
pub use row::Row;

use cli::Args;
use direct::DirectJob;
use launcher::{BackendKind, Launcher, ThreadsLauncher};
use report::Reporter;
use row::{table_footer, Mode, RunInfo};

/// Runs the benchmark `args` describe, printing through `reporter`, and
/// returns rank 0's rows (also written to `--json FILE` when given).
pub fn run(args: &Args, reporter: &Reporter) -> Result<Vec<Row>, BenchError> {
    let plan = args.plan()?;
    let info = RunInfo {
        mode: if args.engine {
            Mode::Engine
        } else {
            Mode::Direct
        },
        backend: args.backend.name().to_string(),
        tensors: if args.engine { args.tensors } else { 1 },
    };
    let rows = match args.backend {
        BackendKind::Threads => {
            let launcher = ThreadsLauncher { ranks: args.ranks };
            if args.engine {
                engine::run_threads(args, &plan, &info, reporter)?
            } else {
                let job = DirectJob {
                    plan: &plan,
                    info,
                    reporter,
                };
                launcher.launch(&job)?.into_iter().flatten().collect()
            }
        }
    };
    reporter.print(&table_footer(&rows))?;
    if let Some(path) = &args.json {
        std::fs::write(path, row::to_json(&rows)).map_err(|source| BenchError::Output {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(rows)
}
