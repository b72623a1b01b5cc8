//! What can go wrong when processes meet.

use std::time::Duration;

/// A rendezvous or store failure. Every variant names what was wrong: the
/// address, the key, the values and the ranks involved (the fields say
/// what their names say).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RendezvousError {
    /// The store at `address` could not be reached within `waited`.
    #[error("the rendezvous store at {address} could not be reached within {waited:?}: {reason}")]
    Unreachable {
        address: String,
        waited: Duration,
        reason: String,
    },
    /// The store refused this client (another protocol, a bad token).
    #[error("the rendezvous store at {address} refused this process: {reason}")]
    Refused { address: String, reason: String },
    /// An operation did not complete within its timeout.
    #[error("{operation} on the rendezvous store timed out after {waited:?}")]
    Timeout { operation: String, waited: Duration },
    /// The connection failed or the peer sent something unreadable.
    #[error("the rendezvous store at {address}: {reason}")]
    Io { address: String, reason: String },
    /// The store answered an operation with an error (a bound exceeded,
    /// a value that is not a number for `add`, ...).
    #[error("{operation}: {reason}")]
    Store { operation: String, reason: String },
    /// Two processes claimed one rank.
    #[error("two processes claim rank {rank} of the job at {address} (check RANK / KOLO_RANK)")]
    RankClaimedTwice { rank: usize, address: String },
    /// Ranks disagree on the size of the job.
    #[error(
        "rank {rank} has a world size of {mine}, but rank {other_rank} has {theirs} \
         (check WORLD_SIZE / KOLO_WORLD_SIZE)"
    )]
    WorldSizeMismatch {
        rank: usize,
        mine: usize,
        other_rank: usize,
        theirs: usize,
    },
    /// A launcher variable is missing or malformed.
    #[error("{variable}={value:?}: {reason}")]
    Config {
        variable: String,
        value: String,
        reason: String,
    },
}

/// The result of a rendezvous operation.
pub type Result<T> = std::result::Result<T, RendezvousError>;
