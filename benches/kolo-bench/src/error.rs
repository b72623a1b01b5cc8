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
    /// `--backend ucx` on a build without the `ucx` feature.
    #[error(
        "this kolo-bench was built without UCX: build it with \
         `cargo build --release -p kolo-bench --features ucx`, then run \
         `kolo-run -n 4 target/release/kolo-bench --backend ucx ...`"
    )]
    UcxNotBuilt,
    /// The ranks were started with different settings (under `mpirun`,
    /// different arguments per rank): the first setting that differs,
    /// rank 0's value and the first rank with another.
    #[error(
        "the ranks disagree on {field}: rank {first_rank} has {first_value}, \
         rank {rank} has {value} (every rank of a job must be given the same arguments)"
    )]
    Disagreement {
        field: String,
        first_rank: usize,
        first_value: String,
        rank: usize,
        value: String,
    },
    /// A rank's plan could not be read (another program, or another
    /// version of kolo-bench, at that rank).
    #[error("rank {rank} sent a plan this kolo-bench cannot read: {reason}")]
    MalformedPlan { rank: usize, reason: String },
    /// Exchanging the plans before the sweep failed.
    #[error("exchanging the plans on rank {rank} failed: {source}")]
    Exchange {
        rank: usize,
        #[source]
        source: TransportError,
    },
    /// Another rank found, before the sweep, that it cannot run.
    #[error("rank {rank} cannot run: {message}")]
    PeerFailed { rank: usize, message: String },
    /// The run's buffers do not fit in the memory a rank's host has free.
    #[error(
        "not enough memory on the host of rank {rank}: this run needs {need} per rank \
         x {local_ranks} rank(s) on that host = {total}, but {available} is available \
         ({origin}); use a smaller --max-bytes or fewer ranks per host"
    )]
    OutOfMemory {
        rank: usize,
        /// Bytes per rank, described ([`crate::size::describe_bytes`]).
        need: String,
        local_ranks: u64,
        total: String,
        available: String,
        /// Where the figure comes from (`MemAvailable in /proc/meminfo`, ...).
        origin: String,
    },
    /// A size whose buffers cannot even be counted in 64 bits.
    #[error("{what}: the buffers would need more than 2^64 bytes per rank")]
    TooLarge { what: String },
    /// Allocating a buffer failed.
    #[error(
        "allocating {elements} elements of {dtype} for {op} of {bytes} bytes failed: {reason}"
    )]
    Allocation {
        op: &'static str,
        bytes: usize,
        elements: usize,
        dtype: &'static str,
        reason: String,
    },
    /// Writing the table or the JSON file failed.
    #[error("writing {path}: {source}")]
    Output {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// An error this rank has already written to stderr (see
    /// [`crate::agreement::exchange::agree_as_process`]); the caller
    /// only exits.
    #[error(transparent)]
    Said(Box<BenchError>),
}
