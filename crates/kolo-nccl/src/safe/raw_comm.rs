//! The owner of NCCL's communicator handle: [`RawComm`] keeps `ncclComm_t`
//! private and offers one method per NCCL call of [`crate::result::nccl`],
//! so no handle travels past this module. The methods that take device
//! addresses stay `unsafe` (the caller vouches for the memory); everything
//! else here is safe: a reduction whose PreMulSum is destroyed after use,
//! groups that always end, and the ends of a communicator (finalize,
//! destroy, abort) consuming it.
//!
//! NCCL forbids two threads calling into one communicator at once, and
//! `ncclCommAbort` frees it. The completion thread's [`Watchdog`] aborts
//! the communicator when an operation times out or NCCL reports an
//! asynchronous error, so that the kernels waiting for a peer that will
//! never come end and the stream moves on. The [`Gate`] keeps that abort
//! away from the owner's calls: the owner enqueues through [`InUse`],
//! which holds the gate, and every call after the abort is refused.

use crate::error::NcclError;
use crate::reduce_plan::{scalar_bytes, NativeOp, NcclType, ReduceKind, ReducePlan};
use crate::result::nccl as result;
use crate::safe::teardown::Teardown;
use crate::sys;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;
use parking_lot::{ReentrantMutex, ReentrantMutexGuard};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An initialised `ncclComm_t`. Dropping it aborts it (never blocks on
/// peers); [`RawComm::finalize`] ends it cleanly.
pub(crate) struct RawComm {
    comm: sys::Comm,
    gate: Arc<Gate>,
}

/// Who may call into the communicator: the owner's enqueues hold `calls`
/// (re-entrant: a group's calls nest), and the watchdog aborts only while
/// holding it, so no enqueue is half-way through the communicator it frees.
/// `aborted` is set once, under `calls`, by whoever aborted or destroyed it.
#[derive(Default)]
pub(crate) struct Gate {
    calls: ReentrantMutex<()>,
    aborted: AtomicBool,
}

impl Gate {
    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}

/// The longest a call waits for the watchdog's abort to end.
const ENTER_WAIT: Duration = Duration::from_secs(10);

/// The communicator while this thread may call into it: the watchdog
/// waits for the guard to drop before aborting.
pub(crate) struct InUse<'c> {
    raw: &'c RawComm,
    _calls: ReentrantMutexGuard<'c, ()>,
}

impl std::ops::Deref for InUse<'_> {
    type Target = RawComm;
    fn deref(&self) -> &RawComm {
        self.raw
    }
}

// SAFETY: an NCCL communicator may be used from any thread as long as no
// two threads use it at once; `RawComm` is only reachable through its
// owner (`NcclComm`, used from one thread at a time; the teardown thread
// once it owns it). The asynchronous-error query of `AsyncProbe` is the
// one call NCCL allows concurrently.
unsafe impl Send for RawComm {}

/// A reduction operation ready for the NCCL calls of one [`ReducePlan`]: a
/// built-in one, or a PreMulSum destroyed when this is dropped (NCCL
/// allows that as soon as the last call using it has returned, so drop it
/// after the group that uses it has ended).
pub(crate) struct Reduction<'c> {
    op: sys::RedOp,
    premul: Option<&'c RawComm>,
}

impl Drop for Reduction<'_> {
    fn drop(&mut self) {
        if let Some(comm) = self.premul.filter(|c| !c.gate.is_aborted()) {
            // SAFETY: created for this communicator by `reduction`, which
            // is live (not aborted); no call uses it after this guard is
            // dropped.
            let _ = unsafe { result::red_op_destroy(self.op, comm.comm) };
        }
    }
}

/// `NCCL_UNIQUE_ID_BYTES` bytes made by [`RawComm::unique_id`] on one rank,
/// handed to every rank's [`RawComm::init`].
pub(crate) const UNIQUE_ID_BYTES: usize = sys::UNIQUE_ID_BYTES;

impl RawComm {
    /// A new `ncclUniqueId`, as the bytes the control plane carries.
    pub(crate) fn unique_id() -> Result<Vec<u8>, NcclError> {
        let id = result::unique_id()?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    }

    /// `ncclCommInitRank` on the device whose context is current, with the
    /// unique id rank 0 made (`id`, as [`RawComm::unique_id`] returned it).
    pub(crate) fn init(nranks: usize, id: &[u8], rank: usize) -> Result<RawComm, NcclError> {
        let id = unique_id_from(id)?;
        let (n, r) = (to_c_int(nranks, "size")?, to_c_int(rank, "rank")?);
        // SAFETY: the caller (`NcclComm::init`) bound the device's context;
        // every rank passes the same `nranks` and `id`.
        let comm = unsafe { result::comm_init_rank(n, id, r) }?;
        Ok(RawComm {
            comm,
            gate: Arc::default(),
        })
    }

    /// The communicator for this thread's calls, until the guard drops;
    /// refused once the watchdog aborted it.
    pub(crate) fn enter(&self) -> Result<InUse<'_>, NcclError> {
        // Held by another thread only while the watchdog aborts, which is
        // bounded unless `ncclCommAbort` waits on work that never ends.
        let calls = self
            .gate
            .calls
            .try_lock_for(ENTER_WAIT)
            .ok_or(NcclError::Aborted)?;
        self.live()?;
        Ok(InUse {
            raw: self,
            _calls: calls,
        })
    }

    /// The watchdog of this communicator, for the completion thread.
    pub(crate) fn watchdog(&self) -> Watchdog {
        Watchdog {
            comm: self.comm,
            gate: self.gate.clone(),
        }
    }

    /// The handle for one call, unless the watchdog aborted it (checked
    /// again before every call: see [`Watchdog::abort`] for the one case
    /// where it aborts while a call is under way).
    fn live(&self) -> Result<sys::Comm, NcclError> {
        if self.gate.is_aborted() {
            return Err(NcclError::Aborted);
        }
        Ok(self.comm)
    }

    /// The NCCL operation of `plan`, creating its PreMulSum when it needs one.
    pub(crate) fn reduction(&self, plan: &ReducePlan) -> Result<Reduction<'_>, NcclError> {
        match plan.kind {
            ReduceKind::Native(op) => Ok(Reduction {
                op: red_op(op),
                premul: None,
            }),
            ReduceKind::PreMulSum(factor) => {
                let mut scalar = scalar_bytes(plan.dtype, factor);
                // SAFETY: the communicator is live while `self` is.
                let op = unsafe {
                    result::pre_mul_sum(&mut scalar, data_type(plan.dtype), self.live()?)
                }?;
                Ok(Reduction {
                    op,
                    premul: Some(self),
                })
            }
        }
    }

    /// `ncclAllReduce` of `count` elements of `dtype` from `send` into
    /// `recv` (equal for in place) with `op`.
    ///
    /// # Safety
    /// `send` and `recv` are device memory of this communicator's device
    /// holding `count` elements of `dtype` each (or are equal), alive until
    /// `stream` reaches the call; `op` was made by this communicator's
    /// [`RawComm::reduction`] and outlives the call (or its group).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn all_reduce(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dtype: NcclType,
        op: &Reduction<'_>,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        // SAFETY: per this function's contract; the handle is live.
        unsafe {
            result::all_reduce(
                dev(send),
                dev(recv),
                count,
                data_type(dtype),
                op.op,
                self.live()?,
                stream.cu_stream(),
            )
        }
    }

    /// `ncclReduceScatter`: `send` holds `count * nranks` elements of
    /// `dtype`, block `rank` of the reduction lands in `recv` (`count`).
    ///
    /// # Safety
    /// As [`RawComm::all_reduce`], with those lengths.
    pub(crate) unsafe fn reduce_scatter(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dtype: NcclType,
        op: &Reduction<'_>,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        // SAFETY: per this function's contract; the handle is live.
        unsafe {
            result::reduce_scatter(
                dev(send),
                dev(recv),
                count,
                data_type(dtype),
                op.op,
                self.live()?,
                stream.cu_stream(),
            )
        }
    }

    /// `ncclReduce` of `count` elements onto `root`'s `recv`.
    ///
    /// # Safety
    /// As [`RawComm::all_reduce`]; `recv` is written on `root` only, and
    /// `root` is a rank of this communicator.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn reduce(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dtype: NcclType,
        op: &Reduction<'_>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        // SAFETY: per this function's contract; the handle is live.
        unsafe {
            result::reduce(
                dev(send),
                dev(recv),
                count,
                data_type(dtype),
                op.op,
                c_rank(root),
                self.live()?,
                stream.cu_stream(),
            )
        }
    }

    /// `ncclBroadcast` of `bytes` from `root`'s `send` into every rank's
    /// `recv`.
    ///
    /// # Safety
    /// `recv` spans `bytes` of this communicator's device (and `send` on
    /// `root`), alive until `stream` reaches the call; `root` is a rank of
    /// this communicator.
    pub(crate) unsafe fn broadcast(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        bytes: usize,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        // SAFETY: per this function's contract; the handle is live.
        unsafe {
            result::broadcast(
                dev(send),
                dev(recv),
                bytes,
                sys::dtype::UINT8,
                c_rank(root),
                self.live()?,
                stream.cu_stream(),
            )
        }
    }

    /// `ncclAllGather`: `send` holds `bytes`, `recv` `bytes * nranks`.
    ///
    /// # Safety
    /// Both span those lengths of this communicator's device, alive until
    /// `stream` reaches the call.
    pub(crate) unsafe fn all_gather(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        bytes: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        // SAFETY: per this function's contract; the handle is live.
        unsafe {
            result::all_gather(
                dev(send),
                dev(recv),
                bytes,
                sys::dtype::UINT8,
                self.live()?,
                stream.cu_stream(),
            )
        }
    }

    /// `ncclSend` of `bytes` at `ptr` to `peer` (nothing when empty).
    ///
    /// # Safety
    /// `ptr` spans `bytes` of this communicator's device, alive until
    /// `stream` reaches the call; `peer` is a rank of this communicator.
    pub(crate) unsafe fn send(
        &self,
        ptr: CUdeviceptr,
        bytes: usize,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: per this function's contract; the handle is live.
        unsafe {
            result::send(
                dev(ptr),
                bytes,
                sys::dtype::UINT8,
                c_rank(peer),
                self.live()?,
                stream.cu_stream(),
            )
        }
    }

    /// `ncclRecv` of `bytes` into `ptr` from `peer` (nothing when empty).
    ///
    /// # Safety
    /// As [`RawComm::send`].
    pub(crate) unsafe fn recv(
        &self,
        ptr: CUdeviceptr,
        bytes: usize,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: per this function's contract; the handle is live.
        unsafe {
            result::recv(
                dev(ptr),
                bytes,
                sys::dtype::UINT8,
                c_rank(peer),
                self.live()?,
                stream.cu_stream(),
            )
        }
    }

    /// `ncclCommFinalize` then `ncclCommDestroy`; aborts instead when
    /// finalizing fails. Blocks while NCCL waits for the peers, so the
    /// teardown runs it on a thread of its own.
    pub(crate) fn finalize(self) -> Teardown {
        let Ok(comm) = self.live() else {
            return Teardown::Aborted;
        };
        // SAFETY: the communicator is live (not aborted) and used by this
        // thread only: its owner gave it up, and the completion thread,
        // whose watchdog could abort it, was stopped first.
        if unsafe { result::comm_finalize(comm) }.is_err() {
            return self.abort();
        }
        self.gate.aborted.store(true, Ordering::Release);
        // SAFETY: live and finalized; released here, never used again
        // (`aborted` is set: the drop below calls nothing).
        let _ = unsafe { result::comm_destroy(comm) };
        Teardown::Finalized
    }

    /// `ncclCommAbort`.
    pub(crate) fn abort(self) -> Teardown {
        drop(self);
        Teardown::Aborted
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        let _calls = self.gate.calls.lock();
        if !self.gate.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: the communicator is live (no one aborted or
            // destroyed it) and never used again.
            let _ = unsafe { result::comm_abort(self.comm) };
        }
    }
}

/// The completion thread's hold on a communicator: it asks NCCL for
/// asynchronous errors, and aborts the communicator when an operation
/// failed or outlived the timeout.
///
/// Valid while its [`RawComm`] lives: `NcclComm` stops the completion
/// thread (which owns the watchdog) before tearing the communicator down,
/// and after an abort the watchdog calls nothing.
#[derive(Clone)]
pub(crate) struct Watchdog {
    comm: sys::Comm,
    gate: Arc<Gate>,
}

// SAFETY: `ncclCommGetAsyncError` is documented as callable while other
// threads use the communicator (watchdog threads rely on it), and the
// abort is serialised with the owner's calls by the gate; the handle stays
// valid as explained on the type.
unsafe impl Send for Watchdog {}

impl Watchdog {
    /// `Some(error)` once NCCL recorded an asynchronous failure.
    pub(crate) fn check(&self) -> Option<NcclError> {
        if self.gate.is_aborted() {
            return None;
        }
        // SAFETY: the communicator is live (see the type's docs), and only
        // this thread aborts it while the completion thread runs.
        match unsafe { result::comm_async_error(self.comm) } {
            Ok(state) => state,
            Err(e) => Some(e),
        }
    }

    /// `ncclCommAbort`, once, so that NCCL's kernels and proxy threads stop
    /// waiting for peers. It waits up to `polite` for a call of the owner's
    /// under way to return; a call still inside NCCL after that is waiting
    /// for a peer that is not coming, and only the abort can end it (as
    /// PyTorch's and XLA's watchdogs do), so the communicator is aborted
    /// under it and the owner's next call is refused.
    /// `true` when this call aborted it (`false`: it was already).
    pub(crate) fn abort(&mut self, polite: Duration) -> bool {
        let calls = self.gate.calls.try_lock_for(polite);
        if self.gate.aborted.swap(true, Ordering::AcqRel) {
            return false;
        }
        // SAFETY: the communicator was live (`aborted` was not set, and
        // only the gate's holders set it); it is never called again but by
        // a call already under way, which the abort ends.
        let _ = unsafe { result::comm_abort(self.comm) };
        drop(calls);
        true
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

/// The unique id in `bytes`, which must be exactly [`UNIQUE_ID_BYTES`] long.
fn unique_id_from(bytes: &[u8]) -> Result<sys::UniqueId, NcclError> {
    if bytes.len() != UNIQUE_ID_BYTES {
        return Err(NcclError::Bootstrap {
            rank: 0,
            message: format!(
                "the unique id has {} bytes, not {UNIQUE_ID_BYTES}",
                bytes.len()
            ),
        });
    }
    let mut id = sys::UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    for (dst, &b) in id.internal.iter_mut().zip(bytes) {
        *dst = b as std::ffi::c_char;
    }
    Ok(id)
}

fn data_type(t: NcclType) -> sys::DataType {
    match t {
        NcclType::Int8 => sys::dtype::INT8,
        NcclType::Uint8 => sys::dtype::UINT8,
        NcclType::Int32 => sys::dtype::INT32,
        NcclType::Int64 => sys::dtype::INT64,
        NcclType::Float16 => sys::dtype::FLOAT16,
        NcclType::Bfloat16 => sys::dtype::BFLOAT16,
        NcclType::Float32 => sys::dtype::FLOAT32,
        NcclType::Float64 => sys::dtype::FLOAT64,
    }
}

fn red_op(op: NativeOp) -> sys::RedOp {
    match op {
        NativeOp::Sum => sys::op::SUM,
        NativeOp::Prod => sys::op::PROD,
        NativeOp::Max => sys::op::MAX,
        NativeOp::Min => sys::op::MIN,
        NativeOp::Avg => sys::op::AVG,
    }
}

/// A device address as NCCL's `void*`.
fn dev(p: CUdeviceptr) -> *mut c_void {
    p as usize as *mut c_void
}

fn c_rank(r: usize) -> c_int {
    // Ranks were checked against the communicator's size, which fit an int
    // when NCCL accepted it.
    r as c_int
}

fn to_c_int(v: usize, what: &str) -> Result<c_int, NcclError> {
    c_int::try_from(v)
        .map_err(|_| NcclError::InvalidArgument(format!("{what} {v} does not fit NCCL's int")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_ids_cross_the_control_plane_intact() {
        let bytes: Vec<u8> = (0..UNIQUE_ID_BYTES)
            .map(|i| (i as u8).wrapping_mul(37))
            .collect();
        let id = unique_id_from(&bytes).unwrap();
        let back: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        assert_eq!(back, bytes);
        let e = unique_id_from(&[1, 2, 3]).unwrap_err();
        assert!(
            e.to_string().contains("the unique id has 3 bytes, not 128"),
            "{e}"
        );
    }

    #[test]
    fn kolo_types_and_ops_map_to_ncclh_values() {
        assert_eq!(data_type(NcclType::Int8), 0);
        assert_eq!(data_type(NcclType::Uint8), 1);
        assert_eq!(data_type(NcclType::Int32), 2);
        assert_eq!(data_type(NcclType::Int64), 4);
        assert_eq!(data_type(NcclType::Float16), 6);
        assert_eq!(data_type(NcclType::Float32), 7);
        assert_eq!(data_type(NcclType::Float64), 8);
        assert_eq!(data_type(NcclType::Bfloat16), 9);
        let ops = [
            NativeOp::Sum,
            NativeOp::Prod,
            NativeOp::Max,
            NativeOp::Min,
            NativeOp::Avg,
        ];
        assert_eq!(ops.map(red_op), [0, 1, 2, 3, 4]);
    }
}
