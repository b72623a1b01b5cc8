//! The one error type of kolo: every failure names the tensor, the value or
//! the rank it is about.

use crate::set_label::SetLabel;
use kolo_transport::TransportError;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Why a kolo call or operation failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ranks submitted `tensor` with conflicting arguments (data type,
    /// collective, reduce op, shape, root, scale factors, ...). Every rank's
    /// handle fails with the coordinator's message, which names both values
    /// and the ranks that sent them; later operations are unaffected.
    #[error("{message}")]
    Mismatch {
        /// The tensor's name.
        tensor: String,
        /// The coordinator's message (Horovod's wording).
        message: String,
    },

    /// The coordinator rejected `tensor` for another reason than a mismatch
    /// between ranks (a scalar allgather, alltoall splits that do not add
    /// up, a root rank out of range, ...), on every rank alike.
    #[error("{message}")]
    Remote {
        /// The tensor's name.
        tensor: String,
        /// The coordinator's message.
        message: String,
    },

    /// Some ranks submitted `tensor` and others did not for longer than the
    /// stall shutdown time (`KOLO_STALL_SHUTDOWN_TIME_SECONDS`).
    #[error("{message}")]
    Stalled {
        /// The tensor's name.
        tensor: String,
        /// The stall inspector's message (names the tensor and the missing
        /// ranks).
        message: String,
    },

    /// The operation on `tensor` did not complete within the timeout
    /// (`KOLO_TIMEOUT`, [`crate::Config::timeout`]): some ranks did not
    /// submit it, or the backend did not finish it (a peer stopped
    /// answering, a link went down). The engine stops; `report` is the
    /// desync report: this rank's last completed and first pending
    /// operations with their sequence numbers, and on rank 0 which ranks
    /// are behind on which tensor.
    #[error("tensor '{tensor}' did not complete within {} s (KOLO_TIMEOUT): {report}", after.as_secs_f64())]
    Timeout {
        /// The tensor's name.
        tensor: String,
        /// The timeout.
        after: Duration,
        /// The desync report.
        report: String,
    },

    /// An operation on `tensor` is still in flight on this rank: a name must
    /// be unique until its operation completes.
    #[error("tensor '{tensor}' is already in flight on this rank; wait for it before submitting the name again")]
    DuplicateName {
        /// The tensor's name.
        tensor: String,
    },

    /// The engine shut down (explicitly, because a rank's `Kolo` was
    /// dropped, or by the stall inspector) before the operation completed,
    /// or the call came after it.
    #[error("kolo was shut down {}", ShutDownBy(by_ranks))]
    ShutDown {
        /// The ranks that asked for the shutdown; empty when the stall
        /// inspector shut kolo down (`KOLO_STALL_SHUTDOWN_TIME_SECONDS`).
        by_ranks: Vec<u32>,
    },

    /// A rank failed (panicked, returned an error, lost its transport)
    /// while this rank depended on it.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank that failed.
        rank: usize,
        /// Why it failed, as far as it told.
        message: String,
    },

    /// The data-plane collective of `tensor` failed on this rank.
    #[error("the collective of tensor '{tensor}' failed: {message}")]
    Collective {
        /// The tensor's name.
        tensor: String,
        /// The backend's or fusion's message.
        message: String,
    },

    /// The control plane failed for a reason other than a failed peer.
    #[error(transparent)]
    Transport(TransportError),

    /// The call's arguments cannot work (the shape does not match the
    /// buffer, an output has the wrong length, a root rank out of range,
    /// ...); detected on this rank, before anything was submitted.
    #[error("tensor '{tensor}': {reason}")]
    InvalidArgument {
        /// The tensor's name.
        tensor: String,
        /// What is wrong, with the values.
        reason: String,
    },

    /// A configuration value (a `KOLO_*` variable or a builder argument) is
    /// malformed.
    #[error("invalid value {value:?} for {variable}: {reason}")]
    Config {
        /// The environment variable (or builder setting) concerned.
        variable: String,
        /// The value given.
        value: String,
        /// What is expected instead.
        reason: String,
    },

    /// The timeline file could not be created.
    #[error("timeline {}: {message}", path.display())]
    Timeline {
        /// The file asked for.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },

    /// A process set cannot be made from `members` (see
    /// [`crate::Kolo::process_set`]): a rank out of range or listed twice,
    /// the caller not among them, or the backend could not connect them.
    #[error("process set {members:?}: {reason}")]
    ProcessSet {
        /// The ranks asked for, as given.
        members: Vec<usize>,
        /// What is wrong, with the values.
        reason: String,
    },

    /// The backend or the engine's thread could not be started.
    #[error("cannot start kolo: {message}")]
    Start {
        /// What went wrong.
        message: String,
    },
}

impl Error {
    /// The tensor the error is about, where it is about one.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            Error::Mismatch { tensor, .. }
            | Error::Remote { tensor, .. }
            | Error::Stalled { tensor, .. }
            | Error::Timeout { tensor, .. }
            | Error::DuplicateName { tensor }
            | Error::Collective { tensor, .. }
            | Error::InvalidArgument { tensor, .. } => Some(tensor),
            _ => None,
        }
    }

    /// A control-plane failure, with a failed peer named as such.
    pub(crate) fn from_transport(error: TransportError) -> Error {
        match error {
            TransportError::PeerFailed { rank, message } => Error::RankFailed { rank, message },
            other => Error::Transport(other),
        }
    }

    /// The failure of `tensor`'s collective, with a failed peer named as
    /// such.
    pub(crate) fn collective(tensor: &str, error: impl Into<kolo_fusion::FusionError>) -> Error {
        match error.into() {
            kolo_fusion::FusionError::Transport(TransportError::PeerFailed { rank, message }) => {
                Error::RankFailed { rank, message }
            }
            other => Error::Collective {
                tensor: tensor.to_owned(),
                message: other.to_string(),
            },
        }
    }

    /// The error an error response carries for `tensor`: a stall, a
    /// mismatch, or another rejection.
    pub(crate) fn from_response(tensor: &str, message: &str) -> Error {
        let tensor = tensor.to_owned();
        let message = message.to_owned();
        if is_stall_message(&message) {
            Error::Stalled { tensor, message }
        } else if message.starts_with("Mismatched") {
            Error::Mismatch { tensor, message }
        } else {
            Error::Remote { tensor, message }
        }
    }
}

impl Error {
    /// A stall that the operation timeout decided (`after`, see
    /// [`crate::Config::timeout`]) as an [`Error::Timeout`], its report the
    /// stall inspector's message (which names the ranks that did not
    /// submit the tensor); any other error as it is.
    pub(crate) fn stall_as_timeout(self, after: Option<Duration>) -> Error {
        match (self, after) {
            (Error::Stalled { tensor, message }, Some(after)) => Error::Timeout {
                tensor,
                after,
                report: message,
            },
            (other, _) => other,
        }
    }
}

impl Error {
    /// This error as it reaches a member of `set`, whose engine numbers
    /// ranks within the set: a failed or shutting-down rank becomes its
    /// world rank, and every message names the set, so that a user with
    /// several sets knows which one failed and how its ranks map.
    pub(crate) fn in_process_set(mut self, set: &SetLabel) -> Error {
        let note = format!(
            " [in {set}: its ranks 0..{} are world ranks {:?}]",
            set.members.len(),
            set.members
        );
        match &mut self {
            Error::Mismatch { message, .. }
            | Error::Remote { message, .. }
            | Error::Stalled { message, .. }
            | Error::Collective { message, .. }
            | Error::Timeout {
                report: message, ..
            }
            | Error::InvalidArgument {
                reason: message, ..
            } => message.push_str(&note),
            Error::RankFailed { rank, message } => {
                *rank = set.world_rank(*rank);
                message.push_str(&note);
            }
            Error::ShutDown { by_ranks } => {
                for r in by_ranks.iter_mut() {
                    *r = set.world_rank(*r as usize) as u32;
                }
            }
            _ => {}
        }
        self
    }
}

/// True for the stall inspector's error messages.
fn is_stall_message(message: &str) -> bool {
    message.to_ascii_lowercase().contains("stall")
}

/// Displays who shut kolo down: `at the request of rank 2`, `... of
/// ranks 0, 3`, or the stall inspector.
struct ShutDownBy<'a>(&'a [u32]);

impl fmt::Display for ShutDownBy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => f.write_str("by the stall inspector"),
            [one] => write!(f, "at the request of rank {one}"),
            many => {
                f.write_str("at the request of ranks ")?;
                for (i, rank) in many.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{rank}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_names_the_ranks() {
        let one = Error::ShutDown { by_ranks: vec![2] };
        assert_eq!(
            one.to_string(),
            "kolo was shut down at the request of rank 2"
        );
        let two = Error::ShutDown {
            by_ranks: vec![0, 3],
        };
        assert_eq!(
            two.to_string(),
            "kolo was shut down at the request of ranks 0, 3"
        );
        let stall = Error::ShutDown { by_ranks: vec![] };
        assert_eq!(
            stall.to_string(),
            "kolo was shut down by the stall inspector"
        );
    }

    #[test]
    fn responses_are_classified() {
        let m = Error::from_response("t", "Mismatched ALLREDUCE data types for tensor 't'");
        assert!(matches!(m, Error::Mismatch { .. }));
        let s = Error::from_response("t", "Stalled tensor 't': ranks 1 did not submit it");
        assert!(matches!(s, Error::Stalled { .. }));
        let r = Error::from_response("t", "ALLGATHER of tensor 't' needs at least one dimension");
        assert!(matches!(r, Error::Remote { .. }));
        assert_eq!(r.tensor(), Some("t"));
    }

    #[test]
    fn a_sets_errors_name_it_and_its_world_ranks() {
        let set = SetLabel {
            members: vec![1, 3, 4],
            ordinal: 0,
        };
        let failed = Error::RankFailed {
            rank: 2,
            message: "gone".into(),
        }
        .in_process_set(&set);
        let Error::RankFailed { rank, ref message } = failed else {
            panic!("{failed:?}");
        };
        assert_eq!(rank, 4);
        assert!(message.contains("process set [1, 3, 4]"), "{message}");
        let mismatch = Error::from_response("w", "Mismatched ALLREDUCE shapes: rank 0 sent [2]")
            .in_process_set(&set)
            .to_string();
        assert!(mismatch.contains("rank 0 sent [2]"), "{mismatch}");
        assert!(
            mismatch.contains("its ranks 0..3 are world ranks [1, 3, 4]"),
            "{mismatch}"
        );
        let shut = Error::ShutDown {
            by_ranks: vec![0, 2],
        }
        .in_process_set(&set);
        assert_eq!(
            shut,
            Error::ShutDown {
                by_ranks: vec![1, 4]
            }
        );
    }

    #[test]
    fn failed_peers_are_named() {
        let e = Error::from_transport(TransportError::PeerFailed {
            rank: 3,
            message: "boom".into(),
        });
        assert_eq!(
            e,
            Error::RankFailed {
                rank: 3,
                message: "boom".into()
            }
        );
    }
}
