//! The device-memory side of [`Pipeline`]: [`Pipeline::send_device`] and
//! [`Pipeline::recv_device`] (feature `nccl`), which move
//! [`crate::DeviceTensor`]s GPU to GPU on NCCL channels, and
//! [`Pipeline::check_device`], which says (without a GPU) whether a
//! message can.

use crate::error::PipelineError;
use crate::link::Role;
use crate::options::Direction;
#[cfg(feature = "nccl")]
use crate::payload::Payload;
use crate::payload::{check_memory, Carrier};
use crate::pipeline::{Engine, Pipeline};
use kolo_transport::MemoryKind;

impl Pipeline {
    /// Sends a device tensor like [`Pipeline::send`], GPU to GPU: the
    /// header goes ahead as host bytes, then the channel sends the elements
    /// from device memory (NCCL's `ncclSend` on the buffer, no host copy);
    /// the receiver takes it with [`Pipeline::recv_device`]. The tensor
    /// must live on the GPU of this rank's end of the channel. Only NCCL
    /// channels move device tensors: on any other channel, or in the
    /// serial engine, this is [`PipelineError::DeviceUnsupported`] naming
    /// the tensor and the channel's ranks (see [`Pipeline::check_device`]).
    #[cfg(feature = "nccl")]
    pub fn send_device(
        &self,
        name: &str,
        tensor: crate::DeviceTensor,
        minibatch: u64,
        direction: Direction,
    ) -> Result<(), PipelineError> {
        self.send_payload(name, Payload::Device(tensor), minibatch, direction)
    }

    /// Receives a device tensor sent with [`Pipeline::send_device`], like
    /// [`Pipeline::recv`]: the channel allocated it on the GPU of this
    /// rank's end once the header arrived and received the elements into
    /// it (NCCL's `ncclRecv`, no host copy). On a channel that moves no
    /// device memory this is [`PipelineError::DeviceUnsupported`]; a
    /// message sent as a host tensor is [`PipelineError::WrongMemory`] (and
    /// stays queued for [`Pipeline::recv`]).
    #[cfg(feature = "nccl")]
    pub fn recv_device(
        &self,
        name: &str,
        minibatch: u64,
        direction: Direction,
    ) -> Result<crate::DeviceTensor, PipelineError> {
        let (i, payload) = self.recv_payload(name, minibatch, direction, MemoryKind::Cuda)?;
        payload.into_device(&self.core.links[i].link, minibatch)
    }

    /// `Ok` when minibatch `minibatch` of `name` in `direction` can move
    /// as a device tensor on this rank's link — its channel is an NCCL
    /// channel of the helper-thread engine — and otherwise the
    /// [`PipelineError::DeviceUnsupported`] that `send_device` /
    /// `recv_device` would return (or why this rank has no such link). It
    /// needs no GPU: a stage may ask once and fall back to host tensors.
    pub fn check_device(
        &self,
        name: &str,
        minibatch: u64,
        direction: Direction,
    ) -> Result<(), PipelineError> {
        let plan = &self.core.plan;
        let producer_side = plan
            .tensor_index(name)
            .is_some_and(|t| plan.tensors()[t].producer == plan.stage());
        let role = if producer_side == (direction == Direction::Forward) {
            Role::Send
        } else {
            Role::Recv
        };
        let i = self.resolve(name, minibatch, direction, role)?;
        check_memory(
            &self.core.links[i].link,
            plan.rank(),
            MemoryKind::Cuda,
            self.carrier(i),
        )
    }

    /// What moves link `i`'s data.
    pub(crate) fn carrier(&self, i: usize) -> Carrier {
        match &self.engine {
            Engine::Threaded(t) => t.carrier(i),
            Engine::Serial(_) => Carrier::Serial,
        }
    }
}
