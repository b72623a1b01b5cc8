//! [`MpiError`]: what kolo-mpi's own operations (beyond kolo's transport
//! traits) can fail with.

use crate::runtime::ThreadLevel;
use kolo_transport::TransportError;

/// An error of a kolo-mpi operation that is not one of kolo's transport
/// calls (those return [`TransportError`]).
#[derive(Debug, thiserror::Error)]
pub enum MpiError {
    /// The operation needs a thread level MPI did not grant.
    #[error(
        "{operation} needs {needed}, but MPI granted {granted} (kolo-mpi asks for \
         MPI_THREAD_MULTIPLE unless threads are disabled, e.g. by KOLO_MPI_THREADS_DISABLE=1; \
         an MPI built without thread support grants less)"
    )]
    ThreadLevel {
        /// What was asked for.
        operation: &'static str,
        /// The level it needs.
        needed: ThreadLevel,
        /// The level MPI granted.
        granted: ThreadLevel,
    },
    /// An MPI call failed.
    #[error(transparent)]
    Mpi(#[from] TransportError),
}

impl From<MpiError> for TransportError {
    fn from(e: MpiError) -> Self {
        match e {
            MpiError::Mpi(inner) => inner,
            other => TransportError::Backend(other.to_string()),
        }
    }
}
