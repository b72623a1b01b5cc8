//! MPI's process-wide lifetime: initialised once with a thread level, and
//! finalised when the last communicator that uses it is dropped.

use kolo_transport::{Result, TransportError};
use mpi::environment::Universe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The level MPI granted, once kolo initialised it (`ThreadLevel as u8 + 1`).
static GRANTED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The thread level MPI granted when kolo initialised it; `None` before.
pub fn granted_thread_level() -> Option<ThreadLevel> {
    match GRANTED.load(Ordering::Acquire) {
        1 => Some(ThreadLevel::Single),
        2 => Some(ThreadLevel::Funneled),
        3 => Some(ThreadLevel::Serialized),
        4 => Some(ThreadLevel::Multiple),
        _ => None,
    }
}

/// True between MPI's initialisation by kolo and its finalisation.
pub(crate) fn is_active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// The thread support level MPI granted (`MPI_Init_thread`'s `provided`),
/// in increasing order of support. Displayed as MPI names it
/// (`MPI_THREAD_FUNNELED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ThreadLevel {
    /// `MPI_THREAD_SINGLE`: one thread in the process.
    Single,
    /// `MPI_THREAD_FUNNELED`: only the thread that initialised MPI calls it.
    Funneled,
    /// `MPI_THREAD_SERIALIZED`: any thread, one at a time.
    Serialized,
    /// `MPI_THREAD_MULTIPLE`: any threads at once.
    Multiple,
}

impl std::fmt::Display for ThreadLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ThreadLevel::Single => "MPI_THREAD_SINGLE",
            ThreadLevel::Funneled => "MPI_THREAD_FUNNELED",
            ThreadLevel::Serialized => "MPI_THREAD_SERIALIZED",
            ThreadLevel::Multiple => "MPI_THREAD_MULTIPLE",
        })
    }
}

impl ThreadLevel {
    fn from_mpi(t: mpi::Threading) -> ThreadLevel {
        match t {
            mpi::Threading::Single => ThreadLevel::Single,
            mpi::Threading::Funneled => ThreadLevel::Funneled,
            mpi::Threading::Serialized => ThreadLevel::Serialized,
            mpi::Threading::Multiple => ThreadLevel::Multiple,
        }
    }
}

/// Owns MPI's initialisation; dropping the last reference finalises MPI.
pub(crate) struct Runtime {
    universe: Option<Universe>,
    pub(crate) level: ThreadLevel,
}

impl Runtime {
    /// Initialises MPI on the calling thread. `multiple` asks for
    /// `MPI_THREAD_MULTIPLE`, otherwise `MPI_THREAD_FUNNELED` (then every MPI
    /// call must come from this thread).
    pub(crate) fn init(multiple: bool) -> Result<Arc<Runtime>> {
        let wanted = if multiple {
            mpi::Threading::Multiple
        } else {
            mpi::Threading::Funneled
        };
        let (universe, provided) = mpi::initialize_with_threading(wanted).ok_or_else(|| {
            TransportError::Backend(
                "MPI is already initialised in this process (kolo-mpi initialises it once; \
                 create one MpiComm and share it)"
                    .into(),
            )
        })?;
        ACTIVE.store(true, Ordering::Release);
        let level = ThreadLevel::from_mpi(provided);
        GRANTED.store(level as u8 + 1, Ordering::Release);
        Ok(Arc::new(Runtime {
            universe: Some(universe),
            level,
        }))
    }

    pub(crate) fn world(&self) -> Option<mpi::topology::SimpleCommunicator> {
        self.universe.as_ref().map(|u| u.world())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        ACTIVE.store(false, Ordering::Release);
        // Dropping the universe calls MPI_Finalize.
        self.universe.take();
    }
}
