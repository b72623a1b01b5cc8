//! The peer allreduce as an [`NcclComm`] operation: when the ranks
//! registered their buffers ([`crate::safe::peer_buffers`]) and
//! [`crate::crossover::choose`] picks a kernel for the request, the
//! in-place allreduce runs kolo-nccl's one-shot or two-shot kernel on the
//! communication stream instead of NCCL. Every rank decides from the same
//! inputs (size, dtype, op, scale, the registration every rank agreed on),
//! so all take the same path in the same order.

use crate::crossover::{choose, PeerAllreduce, Request, Thresholds};
use crate::error::NcclError;
use crate::kernels::allreduce_ptx::Algorithm;
use crate::kernels::peer_allreduce::PeerLaunch;
use crate::safe::comm::NcclComm;
use crate::safe::work::Work;
use cudarc::driver::DevicePtrMut;
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Scale, Topology};

impl NcclComm {
    /// Whether every rank registered its peer buffer: allreduces the
    /// crossover gives a kernel run it (see [`crate::crossover`]).
    pub fn peer_allreduce_active(&self) -> bool {
        self.peer.is_some()
    }

    /// What serves an in-place allreduce of `count` elements of `dtype`
    /// (the same answer on every rank).
    pub fn peer_allreduce_path(
        &self,
        dtype: DataType,
        count: usize,
        op: ReduceOp,
        scale: Scale,
    ) -> PeerAllreduce {
        match self.peer_algorithm(dtype, count, op, scale) {
            Some(Algorithm::OneShot) => PeerAllreduce::OneShot,
            Some(Algorithm::TwoShot) => PeerAllreduce::TwoShot,
            None => PeerAllreduce::Nccl,
        }
    }

    /// The peer kernel for an allreduce of `count` elements of `dtype`,
    /// or `None` for NCCL.
    pub(crate) fn peer_algorithm(
        &self,
        dtype: DataType,
        count: usize,
        op: ReduceOp,
        scale: Scale,
    ) -> Option<Algorithm> {
        let peer = self.peer.as_ref()?;
        let req = Request {
            bytes: count.checked_mul(dtype.size())?,
            world: self.size(),
            dtype,
            op,
            scale,
            capacity: peer.capacity(),
            peers_reachable: true,
        };
        match choose(&req, &Thresholds::DEFAULT) {
            PeerAllreduce::OneShot => Some(Algorithm::OneShot),
            PeerAllreduce::TwoShot => Some(Algorithm::TwoShot),
            PeerAllreduce::Nccl => None,
        }
    }

    /// In place: `buf = postscale_for(op) * sum_r(buf_r)` by `algorithm`
    /// over the registered buffers (the caller checked `buf` holds `count`
    /// elements of `dtype` on this device and chose `algorithm` with
    /// [`Self::peer_algorithm`]).
    pub(crate) fn peer_all_reduce<U>(
        &mut self,
        buf: &mut impl DevicePtrMut<U>,
        algorithm: Algorithm,
        dtype: DataType,
        count: usize,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<Work, NcclError> {
        let (rank, world) = (self.rank(), self.size());
        let what = format!(
            "peer allreduce({}, {algorithm:?}) of {count} {dtype}",
            op.name()
        );
        self.run(what, |comm| {
            let peer = comm
                .peer
                .as_ref()
                .ok_or_else(|| NcclError::InvalidArgument("no registered buffers".into()))?;
            let stream = comm.device.stream().clone();
            let (ptr, _written) = buf.device_ptr_mut(&stream);
            let mut args = PeerLaunch {
                algorithm,
                dtype,
                out: ptr,
                input: ptr,
                peers: peer.peers(),
                rank,
                world,
                n: count,
                epoch: 1,
                capacity: peer.capacity(),
                factor: scale.postscale_for(op, world),
                timeout: comm.options().op_timeout,
            };
            // Checked before the epoch is taken: a rank that took one and
            // launched nothing would leave its peers waiting for it.
            args.validate()?;
            args.epoch = peer.next_epoch();
            // SAFETY: `ptr` holds `count` elements of `dtype` on this
            // device (the caller checked), in and out in place, alive until
            // the stream reaches the kernel (cudarc's events, recorded when
            // the guard drops); the registered buffers live as long as the
            // communicator, were zeroed at registration and every rank
            // takes the same epochs in the same order (same requests, same
            // choice); the stream is this device's.
            unsafe { peer.module().launch(&args, stream.cu_stream()) }.map_err(|e| match e {
                // Past the epoch, any failure breaks the communicator (the
                // peers are waiting for this rank's flags).
                NcclError::InvalidArgument(m) => NcclError::Broken { rank, cause: m },
                other => other,
            })
        })
    }
}
