//! What a link's messages carry — a host [`Tensor`] or (feature `nccl`) a
//! [`crate::DeviceTensor`] — and the two pure decisions about device
//! tensors: may a message of this memory use this link's channel
//! ([`check_memory`]), and is a queued message the kind the caller takes
//! ([`check_taken`]).

use crate::error::PipelineError;
use crate::link::{Link, Role};
use crate::tensor::Tensor;
use kolo_transport::MemoryKind;

/// One message's tensor, in host or device memory.
#[derive(Debug)]
pub(crate) enum Payload {
    /// A host tensor: its bytes travel through the channel's `Collectives`.
    Host(Tensor),
    /// A device tensor: the channel moves it GPU to GPU.
    #[cfg(feature = "nccl")]
    Device(crate::device_tensor::DeviceTensor),
}

impl Payload {
    /// Where the elements live.
    pub(crate) fn memory(&self) -> MemoryKind {
        match self {
            Payload::Host(_) => MemoryKind::Host,
            #[cfg(feature = "nccl")]
            Payload::Device(_) => MemoryKind::Cuda,
        }
    }

    /// The host tensor, or the error of taking minibatch `minibatch` of
    /// `link` as one when it is not.
    pub(crate) fn into_host(self, link: &Link, minibatch: u64) -> Result<Tensor, PipelineError> {
        // Without the `nccl` feature every payload is a host tensor.
        #[cfg(not(feature = "nccl"))]
        let _ = (link, minibatch);
        match self {
            Payload::Host(tensor) => Ok(tensor),
            #[cfg(feature = "nccl")]
            Payload::Device(_) => Err(wrong_memory(link, minibatch, MemoryKind::Cuda)),
        }
    }

    /// The device tensor, or the error of taking minibatch `minibatch` of
    /// `link` as one when it is not.
    #[cfg(feature = "nccl")]
    pub(crate) fn into_device(
        self,
        link: &Link,
        minibatch: u64,
    ) -> Result<crate::device_tensor::DeviceTensor, PipelineError> {
        match self {
            Payload::Device(tensor) => Ok(tensor),
            Payload::Host(_) => Err(wrong_memory(link, minibatch, MemoryKind::Host)),
        }
    }
}

/// What moves a link's messages, as far as device memory goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Carrier {
    /// A helper thread whose channel moves device memory (NCCL).
    DeviceChannel,
    /// A helper thread whose channel is a host backend's `Collectives`.
    HostChannel,
    /// The serial engine's single communicator.
    Serial,
}

/// Whether a message in `memory` may use `link` (of `rank`) when
/// `carrier` moves it: host tensors always may; device tensors only on a
/// channel that moves device memory. The refusal names the tensor, the
/// direction and the channel's two global ranks.
pub(crate) fn check_memory(
    link: &Link,
    rank: usize,
    memory: MemoryKind,
    carrier: Carrier,
) -> Result<(), PipelineError> {
    let why = match (memory, carrier) {
        (MemoryKind::Host, _) | (MemoryKind::Cuda, Carrier::DeviceChannel) => return Ok(()),
        (MemoryKind::Cuda, Carrier::HostChannel) => {
            "it is a host backend's channel, and only NCCL channels \
             (kolo_pipeline::nccl::nccl_channels, or nccl_mpi_channels under mpirun) move \
             device tensors; copy the tensor to the host and use send / recv"
        }
        (MemoryKind::Cuda, Carrier::Serial) => {
            "the serial engine moves host tensors only; start the pipeline with helper threads \
             over NCCL channels (Pipeline::start with nccl_channels or nccl_mpi_channels)"
        }
    };
    let key = link.data_channel(rank);
    Err(PipelineError::DeviceUnsupported {
        name: link.name.clone(),
        direction: link.direction,
        action: match link.role {
            Role::Send => "travel",
            Role::Recv => "arrive",
        },
        sender: key.sender,
        receiver: key.receiver,
        why: why.to_string(),
    })
}

/// Whether minibatch `minibatch` of `link`, which arrived in `arrived`
/// memory, may be taken by a call for `wanted` memory; the refusal says
/// which call takes it (the message stays queued).
pub(crate) fn check_taken(
    link: &Link,
    minibatch: u64,
    arrived: MemoryKind,
    wanted: MemoryKind,
) -> Result<(), PipelineError> {
    if arrived == wanted {
        return Ok(());
    }
    Err(wrong_memory(link, minibatch, arrived))
}

/// The error of minibatch `minibatch` of `link`, which arrived in
/// `arrived` memory, asked for by the call for the other memory.
pub(crate) fn wrong_memory(link: &Link, minibatch: u64, arrived: MemoryKind) -> PipelineError {
    let (arrived, use_instead) = match arrived {
        MemoryKind::Host => ("host", "recv"),
        MemoryKind::Cuda => ("device", "recv_device"),
    };
    PipelineError::WrongMemory {
        name: link.name.clone(),
        direction: link.direction,
        peer: link.peer,
        minibatch,
        arrived,
        use_instead,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Direction;
    use crate::schedule::Replica;
    use kolo_protocol::DataType;
    use proptest::prelude::*;

    fn link(role: Role, direction: Direction, peer: usize) -> Link {
        Link {
            tensor: 0,
            name: "h1".into(),
            dtype: DataType::F32,
            tag: 1,
            direction,
            role,
            peer,
            peer_stage: 1,
            from: Replica { index: 0, width: 1 },
            to: Replica { index: 0, width: 1 },
            expected: 4,
            acked: false,
        }
    }

    fn any_memory() -> impl Strategy<Value = MemoryKind> {
        prop_oneof![Just(MemoryKind::Host), Just(MemoryKind::Cuda)]
    }

    fn any_carrier() -> impl Strategy<Value = Carrier> {
        prop_oneof![
            Just(Carrier::DeviceChannel),
            Just(Carrier::HostChannel),
            Just(Carrier::Serial)
        ]
    }

    proptest! {
        /// Host tensors go everywhere, device tensors only on device
        /// channels; a refusal names the tensor and the channel's ranks,
        /// sender first, whichever end asks.
        #[test]
        fn device_tensors_need_a_device_channel(
            send in any::<bool>(),
            forward in any::<bool>(),
            rank in 0usize..64,
            peer in 0usize..64,
            memory in any_memory(),
            carrier in any_carrier(),
        ) {
            let role = if send { Role::Send } else { Role::Recv };
            let direction = if forward { Direction::Forward } else { Direction::Backward };
            let link = link(role, direction, peer);
            let result = check_memory(&link, rank, memory, carrier);
            let allowed = memory == MemoryKind::Host || carrier == Carrier::DeviceChannel;
            prop_assert_eq!(result.is_ok(), allowed);
            if let Err(e) = result {
                let (sender, receiver) = if send { (rank, peer) } else { (peer, rank) };
                let text = e.to_string();
                let channel = format!("channel from rank {sender} to rank {receiver}");
                let named = format!("tensor 'h1' {direction}");
                prop_assert!(text.contains(&channel), "{}", text);
                prop_assert!(text.starts_with(&named), "{}", text);
                let engine = if carrier == Carrier::Serial { "serial engine" } else { "NCCL channels" };
                prop_assert!(text.contains(engine), "{}", text);
            }
        }

        /// A message is taken only by the call for its memory; the refusal
        /// names the call that takes it.
        #[test]
        fn messages_are_taken_by_the_call_for_their_memory(
            minibatch in any::<u64>(),
            arrived in any_memory(),
            wanted in any_memory(),
        ) {
            let link = link(Role::Recv, Direction::Forward, 3);
            let result = check_taken(&link, minibatch, arrived, wanted);
            prop_assert_eq!(result.is_ok(), arrived == wanted);
            if let Err(e) = result {
                let call = if arrived == MemoryKind::Cuda { "recv_device" } else { "recv" };
                let text = e.to_string();
                let named = format!("tensor 'h1' forward minibatch {minibatch} from rank 3");
                prop_assert!(text.ends_with(&format!("take it with {call}")), "{}", text);
                prop_assert!(text.starts_with(&named), "{}", text);
            }
        }
    }
}
