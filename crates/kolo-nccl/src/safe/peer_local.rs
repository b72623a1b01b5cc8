//! [`LocalPeerRanks`]: the peer allreduce kernels run by several simulated
//! ranks on one device, each with its own registered buffer and stream,
//! for the GPU tests and timings of a machine with one GPU (the kernels,
//! their flag protocol and buffer reuse, never NVLink). Not part of the
//! API.

use crate::crossover::PeerAllreduce;
use crate::error::NcclError;
use crate::kernels::allreduce_ptx::{registered_bytes, Algorithm, MAX_RANKS};
use crate::kernels::peer_allreduce::{PeerAllreduceModule, PeerLaunch};
use crate::safe::peer_buffers::RegisteredAlloc;
use cudarc::driver::{CudaContext, CudaStream};
use kolo_protocol::{DataType, ReduceOp};
use std::sync::Arc;

/// How long a kernel waits for a peer before it traps.
const PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `world` simulated ranks on one device.
#[doc(hidden)]
pub struct LocalPeerRanks {
    ctx: Arc<CudaContext>,
    buffers: Vec<RegisteredAlloc>,
    streams: Vec<Arc<CudaStream>>,
    module: PeerAllreduceModule,
    capacity: usize,
    epoch: u64,
    timeout: std::time::Duration,
}

impl std::fmt::Debug for LocalPeerRanks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPeerRanks")
            .field("world", &self.buffers.len())
            .field("capacity", &self.capacity)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl LocalPeerRanks {
    /// `world` (2 to 8) registered buffers of `capacity` data bytes on
    /// `ctx`'s device, one new non-blocking stream each, and the kernels.
    pub fn new(ctx: &Arc<CudaContext>, world: usize, capacity: usize) -> Result<Self, NcclError> {
        if !(2..=MAX_RANKS).contains(&world) {
            return Err(NcclError::InvalidArgument(format!(
                "{world} simulated ranks: the peer kernels serve 2 to {MAX_RANKS}"
            )));
        }
        let bytes = registered_bytes(capacity).ok_or_else(|| {
            NcclError::InvalidArgument(format!("a registered buffer of {capacity} bytes"))
        })?;
        let buffers = (0..world)
            .map(|_| RegisteredAlloc::new(ctx, bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let streams = (0..world)
            .map(|_| {
                ctx.new_stream()
                    .map_err(NcclError::on_cuda("cuStreamCreate"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let module = PeerAllreduceModule::load(ctx)?;
        Ok(LocalPeerRanks {
            ctx: ctx.clone(),
            buffers,
            streams,
            module,
            capacity,
            epoch: 0,
            timeout: PEER_TIMEOUT,
        })
    }

    /// The ranks' streams, by rank.
    pub fn streams(&self) -> &[Arc<CudaStream>] {
        &self.streams
    }

    /// The data capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How long later launches wait for a peer before they trap (30 s
    /// unless set).
    pub fn set_timeout(&mut self, timeout: std::time::Duration) {
        self.timeout = timeout;
    }

    /// Enqueues one allreduce of `n` elements of `dtype` (f32, f16, bf16;
    /// sum or average): rank `r`'s kernel on stream `r`, reading
    /// `io[r].1` and writing `io[r].0`, the ranks launched in `order` (a
    /// permutation of the ranks; `late` ranks are launched by a second
    /// call to [`Self::launch_late`] with the same epoch).
    ///
    /// # Safety
    /// Every `io[r]` spans `n` elements of `dtype` on this device (output
    /// and input equal or not overlapping), alive until stream `r` reaches
    /// the launch; every rank left out of `order` is launched with
    /// [`Self::launch_late`] before anything waits for the others.
    pub unsafe fn launch(
        &mut self,
        path: PeerAllreduce,
        dtype: DataType,
        op: ReduceOp,
        n: usize,
        io: &[(u64, u64)],
        order: &[usize],
    ) -> Result<u64, NcclError> {
        self.epoch += 1;
        let epoch = self.epoch;
        for &rank in order {
            // SAFETY: forwarded contract.
            unsafe { self.launch_rank(path, dtype, op, n, io, rank, epoch) }?;
        }
        Ok(epoch)
    }

    /// Launches `rank`'s part of the call `epoch` that [`Self::launch`]
    /// left out.
    ///
    /// # Safety
    /// As [`Self::launch`], for the same call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_late(
        &mut self,
        path: PeerAllreduce,
        dtype: DataType,
        op: ReduceOp,
        n: usize,
        io: &[(u64, u64)],
        rank: usize,
        epoch: u64,
    ) -> Result<(), NcclError> {
        if epoch == 0 || epoch > self.epoch {
            return Err(NcclError::InvalidArgument(format!(
                "epoch {epoch} was not started"
            )));
        }
        // SAFETY: forwarded contract.
        unsafe { self.launch_rank(path, dtype, op, n, io, rank, epoch) }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_rank(
        &self,
        path: PeerAllreduce,
        dtype: DataType,
        op: ReduceOp,
        n: usize,
        io: &[(u64, u64)],
        rank: usize,
        epoch: u64,
    ) -> Result<(), NcclError> {
        let world = self.buffers.len();
        let algorithm = match path {
            PeerAllreduce::OneShot => Algorithm::OneShot,
            PeerAllreduce::TwoShot => Algorithm::TwoShot,
            PeerAllreduce::Nccl => {
                return Err(NcclError::InvalidArgument(
                    "simulated ranks run a peer kernel, not NCCL".into(),
                ))
            }
        };
        if io.len() != world || rank >= world {
            return Err(NcclError::InvalidArgument(format!(
                "rank {rank} of {world} simulated ranks with {} buffers",
                io.len()
            )));
        }
        if !matches!(op, ReduceOp::Sum | ReduceOp::Average) {
            return Err(NcclError::InvalidArgument(format!(
                "the peer kernels sum or average, not {}",
                op.name()
            )));
        }
        let mut peers = [0; MAX_RANKS];
        for (slot, buf) in peers.iter_mut().zip(&self.buffers) {
            *slot = buf.ptr();
        }
        let args = PeerLaunch {
            algorithm,
            dtype,
            out: io[rank].0,
            input: io[rank].1,
            peers,
            rank,
            world,
            n,
            epoch,
            capacity: self.capacity,
            factor: kolo_transport::Scale::NONE.postscale_for(op, world),
            timeout: self.timeout,
        };
        self.ctx
            .bind_to_thread()
            .map_err(NcclError::on_cuda("cuCtxSetCurrent"))?;
        // SAFETY: the buffers are this device's registered ones, zeroed
        // and alive as long as `self`; the streams are this context's;
        // epochs count 1, 2, ... and every rank gets the same arguments
        // but its own; `io` per the caller's contract.
        unsafe { self.module.launch(&args, self.streams[rank].cu_stream()) }
    }
}

impl Drop for LocalPeerRanks {
    fn drop(&mut self) {
        // The buffers are freed after every rank's work is done.
        for stream in &self.streams {
            let _ = stream.synchronize();
        }
    }
}
