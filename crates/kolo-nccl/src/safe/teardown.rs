//! The bounded end of a communicator: finalize when healthy, abort
//! otherwise, never blocking the caller longer than the bound.

use crate::safe::raw_comm::RawComm;
use cudarc::driver::CudaContext;
use std::sync::Arc;
use std::time::Duration;

/// How a communicator's teardown (`NcclComm::close` or drop) ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Teardown {
    /// `ncclCommFinalize` and `ncclCommDestroy` completed.
    Finalized,
    /// The communicator was aborted (`ncclCommAbort`): it had failed, or
    /// finalizing it failed.
    Aborted,
    /// Finalize / abort did not return within the bound; the helper thread
    /// doing it was left behind so the process can exit.
    TimedOut,
}

/// Ends `comm` in at most `bound`: finalize + destroy when `healthy`,
/// abort otherwise (or when finalizing fails). The calls run on a helper
/// thread; if they hang (a dead peer), the thread is abandoned and
/// [`Teardown::TimedOut`] returned instead of hanging the caller.
pub(crate) fn teardown(
    comm: RawComm,
    ctx: Arc<CudaContext>,
    healthy: bool,
    bound: Duration,
) -> Teardown {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name("kolo-nccl-teardown".into())
        .spawn(move || {
            let _ = ctx.bind_to_thread();
            let outcome = if healthy {
                comm.finalize()
            } else {
                comm.abort()
            };
            let _ = tx.send(outcome);
        });
    match spawned {
        Ok(_detached) => rx.recv_timeout(bound).unwrap_or(Teardown::TimedOut),
        // The closure (and the communicator in it) was dropped: aborted.
        Err(_) => Teardown::Aborted,
    }
}
