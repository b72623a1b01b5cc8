//! [`PeerGroup`]: the peer allreduce's registration and kernels without an
//! NCCL communicator, over any controller, for the GPU tests of a machine
//! with one GPU: several threads (peer access, trivially on one device) or
//! several processes (CUDA IPC) of GPU 0 register their buffers exactly as
//! [`NcclComm`](crate::NcclComm) does and run the kernels across them,
//! which NCCL itself cannot (it refuses two ranks on one GPU). Not part of
//! the API.

use crate::crossover::PeerAllreduce;
use crate::error::NcclError;
use crate::kernels::allreduce_ptx::Algorithm;
use crate::kernels::peer_allreduce::PeerLaunch;
use crate::options::Mode;
use crate::safe::device::Device;
use crate::safe::peer_buffers::PeerBuffers;
use cudarc::driver::CudaStream;
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Controller, Scale};

/// How long a kernel waits for a peer before it traps.
const PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// This rank's registration among `ctrl`'s ranks. Drop it only once every
/// rank's work on the buffers is done (each rank synchronized its stream,
/// then a barrier): a peer may still read this rank's buffer otherwise.
#[doc(hidden)]
#[derive(Debug)]
pub struct PeerGroup {
    buffers: PeerBuffers,
    rank: usize,
    world: usize,
}

impl PeerGroup {
    /// Registers every rank's buffer of `capacity` data bytes on its
    /// `device`, reached as `mode` says (collective over `ctrl`); `None`
    /// when the ranks could not all reach each other, opted out, or are
    /// not 2 to 8.
    pub fn register<C: Controller + ?Sized>(
        ctrl: &mut C,
        device: &Device,
        mode: Mode,
        capacity: usize,
    ) -> Result<Option<PeerGroup>, NcclError> {
        let ordinals = ctrl
            .allgather_bytes(&(device.ordinal() as u64).to_le_bytes())?
            .iter()
            .map(|b| {
                b.as_slice()
                    .try_into()
                    .map(|b| u64::from_le_bytes(b) as usize)
                    .map_err(|_| NcclError::InvalidArgument("a peer's device ordinal".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (rank, world) = (ctrl.rank(), ctrl.size());
        let buffers =
            PeerBuffers::register(ctrl, device.context(), mode, &ordinals, capacity, true)?;
        device.bind()?;
        Ok(buffers.map(|buffers| PeerGroup {
            buffers,
            rank,
            world,
        }))
    }

    /// Enqueues this rank's part of an in-place allreduce of `n` elements
    /// of `dtype` at `ptr` on `stream`, by `path`.
    ///
    /// # Safety
    /// `ptr` spans `n` elements of `dtype` on this group's device, alive
    /// until `stream` (of that device) reaches the launch; every rank of
    /// the group makes the same calls in the same order.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        path: PeerAllreduce,
        dtype: DataType,
        op: ReduceOp,
        scale: Scale,
        ptr: u64,
        n: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        let algorithm = match path {
            PeerAllreduce::OneShot => Algorithm::OneShot,
            PeerAllreduce::TwoShot => Algorithm::TwoShot,
            PeerAllreduce::Nccl => {
                return Err(NcclError::InvalidArgument(
                    "a peer group runs a peer kernel, not NCCL".into(),
                ))
            }
        };
        if !matches!(op, ReduceOp::Sum | ReduceOp::Average) || scale.prescale != 1.0 {
            return Err(NcclError::InvalidArgument(format!(
                "the peer kernels sum or average without a prescale, not {}",
                op.name()
            )));
        }
        let mut args = PeerLaunch {
            algorithm,
            dtype,
            out: ptr,
            input: ptr,
            peers: self.buffers.peers(),
            rank: self.rank,
            world: self.world,
            n,
            epoch: 1,
            capacity: self.buffers.capacity(),
            factor: scale.postscale_for(op, self.world),
            timeout: PEER_TIMEOUT,
        };
        // Checked before the epoch is taken (see `peer_ops.rs`).
        args.validate()?;
        args.epoch = self.buffers.next_epoch();
        // SAFETY: `ptr` per the caller's contract; the registered buffers
        // live as long as `self`, were zeroed at registration, and every
        // rank takes the same epochs (the same calls in the same order).
        unsafe { self.buffers.module().launch(&args, stream.cu_stream()) }
    }
}
