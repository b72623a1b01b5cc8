//! The error every backend returns.

use thiserror::Error;

/// Why a transport operation failed.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum TransportError {
    /// A peer rank failed (panicked, returned an error, or exited) while this
    /// rank was waiting on it.
    #[error("rank {rank} failed: {message}")]
    PeerFailed {
        /// The failed rank.
        rank: usize,
        /// Why it failed (its error or panic message).
        message: String,
    },
    /// The caller passed arguments that cannot work (wrong lengths, a rank
    /// out of range, ...). The message names the values.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The communicator was shut down.
    #[error("communicator shut down")]
    ShutDown,
    /// A wait exceeded its deadline.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The backend's own failure (an MPI or NCCL error code, ...).
    #[error("backend error: {0}")]
    Backend(String),
    /// The backend does not offer this operation on its memory (see
    /// [`crate::memory`]).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// A result whose error defaults to [`TransportError`].
pub type Result<T, E = TransportError> = std::result::Result<T, E>;
