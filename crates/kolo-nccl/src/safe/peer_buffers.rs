//! The registered buffers of the peer allreduce (see
//! [`crate::kernels::allreduce_ptx`] for the kernels and their flag
//! protocol, [`crate::crossover`] for when they run): one buffer per rank,
//! allocated with `cuMemAlloc` and zeroed once when the communicator is
//! created, large enough for the biggest tensor the crossover sends to a
//! kernel, and reachable by every other rank:
//!
//! - thread mode: every rank's buffer is a pointer of this process's
//!   unified address space; a rank on another device enables peer access
//!   to it (`cuDeviceCanAccessPeer`, `cuCtxEnablePeerAccess`); a rank on
//!   the same device reaches it trivially;
//! - process mode: every rank exports its buffer (`cuIpcGetMemHandle`),
//!   the handles are exchanged over the controller, and every rank maps
//!   the others' (`cuIpcOpenMemHandle`), closing them on drop.
//!
//! Registration is collective and all-or-nothing: every rank learns
//! whether every rank succeeded (and none opted out with
//! `KOLO_NVLINK_ALLREDUCE=0`), so every rank makes the same choice for
//! every allreduce. A failure only leaves the kernels unused.

use crate::bootstrap::{encode_status, first_failure};
use crate::crossover;
use crate::error::NcclError;
use crate::kernels::allreduce_ptx::{registered_bytes, MAX_RANKS};
use crate::kernels::peer_allreduce::PeerAllreduceModule;
use crate::options::Mode;
use crate::result::driver::{self, IPC_HANDLE_BYTES};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaContext;
use kolo_transport::Controller;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One device allocation from `cuMemAlloc` (IPC cannot export
/// stream-ordered pool memory), zeroed, freed on drop.
pub(crate) struct RegisteredAlloc {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
}

impl RegisteredAlloc {
    /// `bytes` of zeroed device memory in `ctx` (made current).
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, NcclError> {
        ctx.bind_to_thread()
            .map_err(NcclError::on_cuda("cuCtxSetCurrent"))?;
        // SAFETY: `ctx` is current; the size is positive (`max(1)`).
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) }
            .map_err(NcclError::on_cuda("cuMemAlloc"))?;
        let alloc = RegisteredAlloc {
            ctx: ctx.clone(),
            ptr,
        };
        // SAFETY: `ptr` spans `bytes` bytes of this context, just
        // allocated; the synchronous memset completes before any peer can
        // learn the address.
        unsafe { cudarc::driver::result::memset_d8_sync(ptr, 0, bytes) }
            .map_err(NcclError::on_cuda("cuMemsetD8"))?;
        Ok(alloc)
    }

    /// The device address.
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
}

impl Drop for RegisteredAlloc {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `new`, freed once here; the owner drops
            // it only once no enqueued work uses it (see `PeerBuffers`).
            let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
        }
    }
}

/// A peer's buffer mapped through CUDA IPC, closed on drop.
struct IpcMapping {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: opened by `ipc_open` in `ctx`, closed once here, after
            // the owner's work is done (see `PeerBuffers`).
            let _ = unsafe { driver::ipc_close(self.ptr) };
        }
    }
}

/// This rank's registered buffer and every rank's, as this device
/// addresses them, with the call counter (the kernels' epoch).
///
/// Dropped by the communicator after its teardown, when its own stream is
/// drained (and, in thread mode, every rank's).
pub(crate) struct PeerBuffers {
    peers: [CUdeviceptr; MAX_RANKS],
    capacity: usize,
    epoch: AtomicU64,
    module: PeerAllreduceModule,
    // Mappings close before the own buffer is freed.
    _mappings: Vec<IpcMapping>,
    _contexts: Vec<Arc<CudaContext>>,
    _own: RegisteredAlloc,
}

impl std::fmt::Debug for PeerBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerBuffers")
            .field("capacity", &self.capacity)
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .finish()
    }
}

impl PeerBuffers {
    /// Every rank's registered buffer (unused slots 0).
    pub(crate) fn peers(&self) -> [CUdeviceptr; MAX_RANKS] {
        self.peers
    }

    /// The data capacity in bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The kernels, loaded when the buffers were registered.
    pub(crate) fn module(&self) -> &PeerAllreduceModule {
        &self.module
    }

    /// The next call's epoch (1, 2, ...): every rank takes one per peer
    /// allreduce, in the same order.
    pub(crate) fn next_epoch(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Registers every rank's buffer of `capacity` data bytes. Collective
    /// over `ctrl` (three all-gathers) whenever `2 <= size <= 8`; `None` on
    /// every rank when any rank opted out (`wanted` false or the
    /// environment's switch off) or failed, or for other sizes
    /// (without a collective: every rank knows the size). An invalid
    /// `KOLO_NVLINK_ALLREDUCE` is an error on every rank.
    pub(crate) fn register<C: Controller + ?Sized>(
        ctrl: &mut C,
        ctx: &Arc<CudaContext>,
        mode: Mode,
        ordinals: &[usize],
        capacity: usize,
        wanted: bool,
    ) -> Result<Option<PeerBuffers>, NcclError> {
        let (rank, size) = (ctrl.rank(), ctrl.size());
        if !(2..=MAX_RANKS).contains(&size) || ordinals.len() != size {
            return Ok(None);
        }
        let enabled = crossover::enabled_by_env();
        crate::bootstrap::agree(
            ctrl,
            "reading KOLO_NVLINK_ALLREDUCE",
            enabled.clone().map(|_| ()),
        )?;
        // Step 1: allocate and describe this rank's buffer and load the
        // kernels (an empty payload: opted out).
        let own = if enabled? && wanted {
            registered_bytes(capacity)
                .ok_or_else(|| {
                    NcclError::InvalidArgument(format!("a registered buffer of {capacity} bytes"))
                })
                .and_then(|bytes| RegisteredAlloc::new(ctx, bytes))
                .and_then(|alloc| Ok((alloc, PeerAllreduceModule::load(ctx)?)))
                .map(Some)
        } else {
            Ok(None)
        };
        let payload = match (&own, mode) {
            (Ok(None), _) => Ok(Vec::new()),
            (Ok(Some((alloc, _))), Mode::ThreadPerGpu) => Ok(alloc.ptr().to_le_bytes().to_vec()),
            // SAFETY: `alloc` is a live `cuMemAlloc` allocation of `ctx`,
            // current since `RegisteredAlloc::new`.
            (Ok(Some((alloc, _))), Mode::ProcessPerGpu) => {
                unsafe { driver::ipc_handle(alloc.ptr()) }.map(|h| h.to_vec())
            }
            (Err(e), _) => Err(e.clone()),
        };
        let all = ctrl.allgather_bytes(&encode_status(payload))?;
        let wanted = match mode {
            Mode::ThreadPerGpu => 8,
            Mode::ProcessPerGpu => IPC_HANDLE_BYTES,
        };
        // Every rank sees the same statuses: all reach the same verdict.
        let usable = first_failure(&all).is_none() && all.iter().all(|s| s.len() == 1 + wanted);
        let Some((own, module)) = own.ok().flatten().filter(|_| usable) else {
            return Ok(None);
        };
        // Step 2: reach every other rank's buffer.
        let opened = Self::open(ctx, mode, rank, ordinals, &all, &own);
        let statuses = ctrl.allgather_bytes(&encode_status(
            opened.as_ref().map(|_| Vec::new()).map_err(Clone::clone),
        ))?;
        if first_failure(&statuses).is_some() {
            return Ok(None);
        }
        let (peers, mappings, contexts) = match opened {
            Ok(parts) => parts,
            Err(_) => return Ok(None),
        };
        Ok(Some(PeerBuffers {
            peers,
            capacity,
            epoch: AtomicU64::new(0),
            module,
            _mappings: mappings,
            _contexts: contexts,
            _own: own,
        }))
    }

    /// Step 2 of [`Self::register`] on this rank.
    #[allow(clippy::type_complexity)]
    fn open(
        ctx: &Arc<CudaContext>,
        mode: Mode,
        rank: usize,
        ordinals: &[usize],
        all: &[Vec<u8>],
        own: &RegisteredAlloc,
    ) -> Result<
        (
            [CUdeviceptr; MAX_RANKS],
            Vec<IpcMapping>,
            Vec<Arc<CudaContext>>,
        ),
        NcclError,
    > {
        let mut peers = [0; MAX_RANKS];
        let mut mappings = Vec::new();
        let mut contexts = Vec::new();
        for (peer, status) in all.iter().enumerate() {
            let payload = &status[1..];
            if peer == rank {
                peers[peer] = own.ptr();
                continue;
            }
            match mode {
                Mode::ThreadPerGpu => {
                    let ptr = payload
                        .try_into()
                        .map(u64::from_le_bytes)
                        .map_err(|_| NcclError::InvalidArgument("a peer pointer".into()))?;
                    let ordinal = ordinals[peer];
                    if ordinal != ctx.ordinal() {
                        let other = CudaContext::new(ordinal)
                            .map_err(NcclError::on_cuda("cuDevicePrimaryCtxRetain"))?;
                        if !driver::can_access_peer(ctx.cu_device(), other.cu_device())? {
                            return Err(NcclError::InvalidArgument(format!(
                                "device {} cannot access device {ordinal} directly",
                                ctx.ordinal()
                            )));
                        }
                        ctx.bind_to_thread()
                            .map_err(NcclError::on_cuda("cuCtxSetCurrent"))?;
                        // SAFETY: `other` is a live (retained) context and
                        // `ctx`, the one gaining access, is current.
                        unsafe { driver::enable_peer_access(other.cu_ctx()) }?;
                        contexts.push(other);
                    }
                    peers[peer] = ptr;
                }
                Mode::ProcessPerGpu => {
                    let handle: &[u8; IPC_HANDLE_BYTES] = payload
                        .try_into()
                        .map_err(|_| NcclError::InvalidArgument("a peer IPC handle".into()))?;
                    ctx.bind_to_thread()
                        .map_err(NcclError::on_cuda("cuCtxSetCurrent"))?;
                    // SAFETY: `ctx` is current; the handle is the peer's
                    // export of its live buffer (it stays alive until the
                    // communicators are torn down).
                    let ptr = unsafe { driver::ipc_open(handle) }?;
                    mappings.push(IpcMapping {
                        ctx: ctx.clone(),
                        ptr,
                    });
                    peers[peer] = ptr;
                }
            }
        }
        ctx.bind_to_thread()
            .map_err(NcclError::on_cuda("cuCtxSetCurrent"))?;
        Ok((peers, mappings, contexts))
    }
}
