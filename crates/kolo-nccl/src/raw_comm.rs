//! The safe layer over [`crate::result`]: an owned NCCL communicator whose
//! drop aborts it, a PreMulSum operation destroyed after use, groups that
//! always end, and the bounded teardown.

use crate::error::NcclError;
use crate::result;
use crate::sys;
use cudarc::driver::CudaContext;
use std::sync::Arc;
use std::time::Duration;

/// An initialised `ncclComm_t`. Dropping it aborts it (never blocks on
/// peers); [`teardown`] finalizes it when healthy.
pub(crate) struct RawComm {
    comm: sys::Comm,
}

// SAFETY: an NCCL communicator may be used from any thread as long as no
// two threads use it at once; `RawComm` is only reachable through `&mut`
// of its owner (the asynchronous-error query of `AsyncProbe` is the one
// call NCCL allows concurrently).
unsafe impl Send for RawComm {}

impl RawComm {
    /// `ncclCommInitRank` on the device whose context is current.
    pub(crate) fn init(
        nranks: usize,
        id: sys::UniqueId,
        rank: usize,
    ) -> Result<RawComm, NcclError> {
        let (n, r) = (to_c_int(nranks, "size")?, to_c_int(rank, "rank")?);
        // SAFETY: the caller (`NcclComm::init`) bound the device's context;
        // every rank passes the same `nranks` and `id`.
        let comm = unsafe { result::comm_init_rank(n, id, r) }?;
        Ok(RawComm { comm })
    }

    /// The handle, for the `result` calls made by this crate's safe code.
    pub(crate) fn handle(&self) -> sys::Comm {
        self.comm
    }

    /// A probe of this communicator's asynchronous error, for the
    /// completion thread.
    pub(crate) fn probe(&self) -> AsyncProbe {
        AsyncProbe { comm: self.comm }
    }

    fn into_handle(self) -> sys::Comm {
        let comm = self.comm;
        std::mem::forget(self);
        comm
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        // SAFETY: the communicator is live and never used again.
        let _ = unsafe { result::comm_abort(self.comm) };
    }
}

/// Asks NCCL for a communicator's asynchronous error from another thread.
///
/// Valid while its [`RawComm`] lives: `NcclComm` stops the completion
/// thread (which owns the probe) before tearing the communicator down.
pub(crate) struct AsyncProbe {
    comm: sys::Comm,
}

// SAFETY: `ncclCommGetAsyncError` is documented as callable while other
// threads use the communicator (watchdog threads rely on it); the handle
// stays valid as explained on the type.
unsafe impl Send for AsyncProbe {}

impl AsyncProbe {
    /// `Some(error)` once NCCL recorded an asynchronous failure.
    pub(crate) fn check(&self) -> Option<NcclError> {
        // SAFETY: the communicator is live (see the type's docs).
        match unsafe { result::comm_async_error(self.comm) } {
            Ok(state) => state,
            Err(e) => Some(e),
        }
    }
}

/// A reduction made by `ncclRedOpCreatePreMulSum`, destroyed on drop (NCCL
/// allows that as soon as the last call using it has returned).
pub(crate) struct PreMulSum<'c> {
    op: sys::RedOp,
    comm: &'c RawComm,
}

impl<'c> PreMulSum<'c> {
    /// Multiplies every input by the value held in `scalar` (`dtype`'s
    /// bytes, see `reduce_plan::scalar_bytes`), then sums.
    pub(crate) fn new(
        comm: &'c RawComm,
        mut scalar: [u8; 8],
        dtype: sys::DataType,
    ) -> Result<Self, NcclError> {
        // SAFETY: the communicator is live for 'c.
        let op = unsafe { result::pre_mul_sum(&mut scalar, dtype, comm.handle()) }?;
        Ok(PreMulSum { op, comm })
    }

    pub(crate) fn op(&self) -> sys::RedOp {
        self.op
    }
}

impl Drop for PreMulSum<'_> {
    fn drop(&mut self) {
        // SAFETY: created for this live communicator; no call uses it after
        // this guard is dropped.
        let _ = unsafe { result::red_op_destroy(self.op, self.comm.handle()) };
    }
}

/// Runs `enqueue` between `ncclGroupStart` and `ncclGroupEnd`; the group is
/// ended even when `enqueue` fails, and the first error is returned.
pub(crate) fn grouped<T>(enqueue: impl FnOnce() -> Result<T, NcclError>) -> Result<T, NcclError> {
    result::group_start()?;
    let out = enqueue();
    let end = result::group_end();
    let out = out?;
    end?;
    Ok(out)
}

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
    let handle = SendComm(comm.into_handle());
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name("kolo-nccl-teardown".into())
        .spawn(move || {
            let handle = handle;
            let _ = ctx.bind_to_thread();
            // SAFETY: the communicator is live and owned by this thread.
            let finalized = healthy && unsafe { result::comm_finalize(handle.0) }.is_ok();
            let outcome = if finalized {
                // SAFETY: live and finalized; released here, never used again.
                let _ = unsafe { result::comm_destroy(handle.0) };
                Teardown::Finalized
            } else {
                // SAFETY: live (not destroyed); released here, never used again.
                let _ = unsafe { result::comm_abort(handle.0) };
                Teardown::Aborted
            };
            let _ = tx.send(outcome);
        });
    match spawned {
        Ok(_detached) => rx.recv_timeout(bound).unwrap_or(Teardown::TimedOut),
        Err(_) => Teardown::TimedOut,
    }
}

struct SendComm(sys::Comm);
// SAFETY: the handle moves to the teardown thread, the only user from then on.
unsafe impl Send for SendComm {}

fn to_c_int(v: usize, what: &str) -> Result<std::ffi::c_int, NcclError> {
    std::ffi::c_int::try_from(v)
        .map_err(|_| NcclError::InvalidArgument(format!("{what} {v} does not fit NCCL's int")))
}
