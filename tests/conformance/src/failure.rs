//! What a failed case reports, and how the ranks agree on it.

use kolo_transport::{Controller, TransportError};
use thiserror::Error;

/// A failed conformance case. Every variant names the case (operation,
/// dtype, counts, root, op, scale, communicator size) and a rank.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum Failure {
    /// An element of the result differs from the sequential reference.
    #[error("{case}: rank {rank}, index {index}: expected {expected}, got {got}")]
    Mismatch {
        /// The case.
        case: String,
        /// The rank whose result is wrong.
        rank: usize,
        /// The element's index in that rank's result.
        index: usize,
        /// The reference value.
        expected: String,
        /// The value the backend produced.
        got: String,
    },
    /// A check other than an element comparison failed (a message's
    /// length, a gather's presence on the root, ...).
    #[error("{case}: rank {rank}: {message}")]
    Check {
        /// The case.
        case: String,
        /// The rank that saw it.
        rank: usize,
        /// What was wrong.
        message: String,
    },
    /// The backend returned an error where none was expected.
    #[error("{case}: rank {rank}: transport error: {error}")]
    Transport {
        /// The case.
        case: String,
        /// The rank that got the error.
        rank: usize,
        /// The error.
        error: TransportError,
    },
    /// Another rank failed this case (this rank's results may be right);
    /// `message` is that rank's failure.
    #[error("{message} (reported by rank {rank} to rank {observer})")]
    Peer {
        /// The case.
        case: String,
        /// The rank that failed.
        rank: usize,
        /// The rank returning this failure.
        observer: usize,
        /// The failing rank's failure, as text.
        message: String,
    },
}

impl Failure {
    /// The case that failed.
    pub fn case(&self) -> &str {
        match self {
            Failure::Mismatch { case, .. }
            | Failure::Check { case, .. }
            | Failure::Transport { case, .. }
            | Failure::Peer { case, .. } => case,
        }
    }

    /// The rank the failure is about (for `Peer`, the rank that failed).
    pub fn rank(&self) -> usize {
        match self {
            Failure::Mismatch { rank, .. }
            | Failure::Check { rank, .. }
            | Failure::Transport { rank, .. }
            | Failure::Peer { rank, .. } => *rank,
        }
    }
}

/// Maps a backend error during `case` on `rank` to a failure.
pub(crate) fn transport(case: &str, rank: usize) -> impl FnOnce(TransportError) -> Failure + '_ {
    move |error| Failure::Transport {
        case: case.to_owned(),
        rank,
        error,
    }
}

/// A [`Failure::Check`].
pub(crate) fn check(case: &str, rank: usize, message: String) -> Failure {
    Failure::Check {
        case: case.to_owned(),
        rank,
        message,
    }
}

/// Every rank learns whether any rank failed `case` (one `allgather_bytes`),
/// so that all of them stop together instead of the healthy ones walking
/// into the next collective alone. A rank returns its own failure, or else
/// the lowest failing rank's as [`Failure::Peer`].
pub(crate) fn agree<C: Controller + ?Sized>(
    comm: &mut C,
    case: &str,
    local: Result<(), Failure>,
) -> Result<(), Failure> {
    let rank = comm.rank();
    let text = match &local {
        Ok(()) => Vec::new(),
        Err(failure) => failure.to_string().into_bytes(),
    };
    let all = comm.allgather_bytes(&text).map_err(transport(case, rank))?;
    local?;
    match all.iter().position(|m| !m.is_empty()) {
        None => Ok(()),
        Some(failed) => Err(Failure::Peer {
            case: case.to_owned(),
            rank: failed,
            observer: rank,
            message: String::from_utf8_lossy(&all[failed]).into_owned(),
        }),
    }
}
