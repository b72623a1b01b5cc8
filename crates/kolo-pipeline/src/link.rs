//! A link: one (tensor, peer, direction) stream of this rank's messages —
//! who sends, which minibatches in which order, on which channel — and how
//! what arrives on it is checked and what goes wrong is named.

use crate::channels::{ChannelKey, ChannelKind};
use crate::error::PipelineError;
use crate::options::Direction;
use crate::schedule::{self, Replica};
use crate::wire::Header;
use kolo_protocol::DataType;
use kolo_transport::{MemoryKind, TransportError};

/// Whether this rank sends or receives on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    Send,
    Recv,
}

/// One (tensor, peer, direction) stream of messages of this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) tensor: usize,
    pub(crate) name: String,
    pub(crate) dtype: DataType,
    pub(crate) tag: u32,
    pub(crate) direction: Direction,
    pub(crate) role: Role,
    pub(crate) peer: usize,
    pub(crate) peer_stage: usize,
    /// The sending and receiving replicas (of their stages).
    pub(crate) from: Replica,
    pub(crate) to: Replica,
    /// Messages over the run.
    pub(crate) expected: u64,
    /// Forward-only: the receiver acknowledges every message.
    pub(crate) acked: bool,
}

impl Link {
    /// The minibatch of the `n`-th message.
    pub(crate) fn nth(&self, n: u64) -> Option<u64> {
        schedule::link_nth(self.from, self.to, n)
    }

    /// The position of `minibatch` on this link.
    pub(crate) fn position(&self, minibatch: u64) -> Option<u64> {
        schedule::link_position(self.from, self.to, minibatch)
    }

    /// The channel its data travels on.
    pub(crate) fn data_channel(&self, rank: usize) -> ChannelKey {
        let (sender, receiver) = match self.role {
            Role::Send => (rank, self.peer),
            Role::Recv => (self.peer, rank),
        };
        ChannelKey {
            tensor: self.name.clone(),
            tag: self.tag,
            kind: match self.direction {
                Direction::Forward => ChannelKind::Activations,
                Direction::Backward => ChannelKind::Gradients,
            },
            sender,
            receiver,
        }
    }

    /// The channel its acks travel on (the reverse of the data).
    pub(crate) fn ack_channel(&self, rank: usize) -> ChannelKey {
        let data = self.data_channel(rank);
        ChannelKey {
            kind: ChannelKind::Acks,
            sender: data.receiver,
            receiver: data.sender,
            ..data
        }
    }
}

/// The dtype, shape and memory of a tensor header, checked against the
/// link.
pub(crate) fn expect_tensor(
    link: &Link,
    due: Option<u64>,
    header: Header,
) -> Result<(DataType, Vec<usize>, MemoryKind), PipelineError> {
    match header {
        Header::Tensor {
            dtype,
            shape,
            minibatch,
            memory,
        } => {
            if Some(minibatch) != due {
                return Err(protocol(
                    link,
                    format!("minibatch {minibatch} arrived when minibatch {due:?} was due"),
                ));
            }
            if dtype != link.dtype {
                return Err(PipelineError::DType {
                    name: link.name.clone(),
                    direction: link.direction,
                    action: "a received message",
                    expected: link.dtype,
                    got: dtype,
                });
            }
            Ok((dtype, shape, memory))
        }
        other => Err(protocol(
            link,
            format!("expected a tensor header, got {other:?}"),
        )),
    }
}

/// Bytes of a tensor of `shape` (checked addressable when its header was
/// decoded).
pub(crate) fn byte_len(shape: &[usize], dtype: DataType) -> usize {
    crate::tensor::element_count(shape, dtype).map_or(0, |n| n * dtype.size())
}

/// The failure of a peer that aborted with `reason` (UTF-8 bytes).
pub(crate) fn aborted(link: &Link, minibatch: Option<u64>, reason: &[u8]) -> PipelineError {
    PipelineError::PeerFailed {
        name: link.name.clone(),
        direction: link.direction,
        peer: link.peer,
        peer_stage: link.peer_stage,
        minibatch,
        message: format!("aborted: {}", String::from_utf8_lossy(reason)),
    }
}

/// A message that is not what the plan says the peer sends.
pub(crate) fn protocol(link: &Link, message: String) -> PipelineError {
    PipelineError::Protocol {
        name: link.name.clone(),
        direction: link.direction,
        peer: link.peer,
        message,
    }
}

/// A backend error on `link`; a peer's failure names the peer's global rank
/// and stage (the channel's own rank numbers stay in the message).
pub(crate) fn transport_error(
    link: &Link,
    minibatch: Option<u64>,
    e: TransportError,
) -> PipelineError {
    match e {
        TransportError::PeerFailed { message, .. } => PipelineError::PeerFailed {
            name: link.name.clone(),
            direction: link.direction,
            peer: link.peer,
            peer_stage: link.peer_stage,
            minibatch,
            message,
        },
        source => PipelineError::Transport {
            name: link.name.clone(),
            direction: link.direction,
            peer: link.peer,
            minibatch,
            source,
        },
    }
}
