//! The errors of the benchmark tool.

use kolo_transport::TransportError;
use thiserror::Error;

/// Why a benchmark could not run or report.
#[derive(Debug, Error)]
pub enum BenchError {
    /// A size argument that is not a byte count.
    #[error("invalid size {value:?}: {reason}")]
    InvalidSize { value: String, reason: String },
    /// Sweep bounds that describe no sizes (min > max, factor < 2, ...).
    #[error("invalid sweep: {0}")]
    InvalidSweep(String),
    /// Any other flag combination that cannot run; the message names it.
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    /// A collective failed on one rank.
    #[error("{op} of {bytes} bytes failed on rank {rank}: {source}")]
    Collective {
        op: &'static str,
        bytes: usize,
        rank: usize,
        #[source]
        source: TransportError,
    },
    /// The control-plane exchange of timings failed.
    #[error("gathering timings on rank {rank} failed: {source}")]
    Gather {
        rank: usize,
        #[source]
        source: TransportError,
    },
    /// A rank's timing report could not be decoded (a peer sent garbage).
    #[error("malformed timing report from rank {rank}: {reason}")]
    MalformedReport { rank: usize, reason: String },
    /// Starting or joining the ranks failed (a rank panicked or errored).
    #[error("running {backend} ranks failed: {message}")]
    Launch {
        backend: &'static str,
        message: String,
    },
    /// The kolo engine returned an error.
    #[error("engine {op} of {bytes} bytes failed on rank {rank}: {source}")]
    Engine {
        op: &'static str,
        bytes: usize,
        rank: usize,
        #[source]
        source: kolo::Error,
    },
    /// `--backend mpi` in a binary built without the `mpi` feature.
    #[error(
        "this kolo-bench was built without MPI: build it with \
         `cargo build --release -p kolo-bench --features mpi`, then run \
         `mpirun -np 4 target/release/kolo-bench --backend mpi ...`"
    )]
    MpiNotBuilt,
    /// Writing the table or the JSON file failed.
    #[error("writing {path}: {source}")]
    Output {
        path: String,
        #[source]
        source: std::io::Error,
    },
}
