//! The errors of kolo-pipeline: an inconsistent pipeline description
//! ([`PlanError`]), a tensor that cannot be built or read as asked
//! ([`TensorError`]), and a send or receive that failed ([`PipelineError`]).

use crate::Direction;
use kolo_protocol::DataType;
use kolo_transport::TransportError;
use thiserror::Error;

/// Why a pipeline description is inconsistent. Every rank validates the same
/// description the same way, so every rank reports the same error.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    /// The world has no ranks.
    #[error("the pipeline's world has no ranks")]
    NoRanks,
    /// The description lists no stage.
    #[error("the pipeline has no stages")]
    NoStages,
    /// A stage lists no rank.
    #[error("stage {stage} has no ranks")]
    EmptyStage {
        /// The empty stage.
        stage: usize,
    },
    /// A stage names a rank outside the world.
    #[error("stage {stage} lists rank {rank}, but the world has only {world_size} ranks")]
    RankOutOfRange {
        /// The rank listed.
        rank: usize,
        /// The stage that lists it.
        stage: usize,
        /// The number of ranks in the world.
        world_size: usize,
    },
    /// A rank is listed twice (in two stages or twice in one).
    #[error("rank {rank} is in stage {first} and again in stage {second}")]
    RankInTwoStages {
        /// The rank.
        rank: usize,
        /// The first stage that lists it.
        first: usize,
        /// The next stage that lists it (may equal `first`).
        second: usize,
    },
    /// A rank of the world is in no stage.
    #[error("rank {rank} is in no stage ({world_size} ranks, stages cover {covered})")]
    RankInNoStage {
        /// The lowest rank missing.
        rank: usize,
        /// The number of ranks in the world.
        world_size: usize,
        /// How many ranks the stages list.
        covered: usize,
    },
    /// The rank asking for its plan is not in the world.
    #[error("rank {rank} is not in the world of {world_size} ranks")]
    NotInWorld {
        /// The rank.
        rank: usize,
        /// The number of ranks in the world.
        world_size: usize,
    },
    /// A tensor has an empty name.
    #[error("tensor #{index} has an empty name")]
    EmptyName {
        /// Its position in the description.
        index: usize,
    },
    /// Two tensors share a name.
    #[error("tensor '{name}' is described twice")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// Two tensors share a tag.
    #[error("tag {tag} is used by tensor '{first}' and by tensor '{second}'")]
    DuplicateTag {
        /// The tag.
        tag: u32,
        /// The first tensor using it.
        first: String,
        /// The second tensor using it.
        second: String,
    },
    /// A tag is in the range kolo reserves for itself.
    #[error(
        "tensor '{name}' uses tag {tag}, which is reserved: tags must be below {limit:#x} \
         (kolo_transport::RESERVED_TAG_BASE)"
    )]
    ReservedTag {
        /// The tensor.
        name: String,
        /// Its tag.
        tag: u32,
        /// The first reserved tag.
        limit: u32,
    },
    /// A tensor is produced but no stage receives it.
    #[error("tensor '{name}' is sent by stage {producer} but never received (no consumer stage)")]
    NeverReceived {
        /// The tensor.
        name: String,
        /// The stage that produces it.
        producer: usize,
    },
    /// A tensor is consumed but no stage sends it.
    #[error("tensor '{name}' is received by stage {consumer} but never sent (no producer stage)")]
    NeverSent {
        /// The tensor.
        name: String,
        /// The stage that consumes it.
        consumer: usize,
    },
    /// A tensor has neither producer nor consumer.
    #[error("tensor '{name}' has neither a producer nor a consumer stage")]
    Unrouted {
        /// The tensor.
        name: String,
    },
    /// A tensor names a stage that does not exist.
    #[error("tensor '{name}' names stage {stage}, but the pipeline has {stages} stages")]
    StageOutOfRange {
        /// The tensor.
        name: String,
        /// The stage named.
        stage: usize,
        /// The number of stages.
        stages: usize,
    },
    /// A tensor would flow from a stage to itself or to an earlier stage.
    #[error(
        "tensor '{name}' goes from stage {producer} to stage {consumer}: \
         activations must flow to a later stage"
    )]
    NotForward {
        /// The tensor.
        name: String,
        /// The producing stage.
        producer: usize,
        /// The consuming stage.
        consumer: usize,
    },
    /// A forward-only window of zero messages could never send anything.
    #[error("the forward-only window must allow at least one message in flight")]
    ZeroWindow,
}

/// Why a tensor could not be built or read as asked.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum TensorError {
    /// The element count does not match the shape.
    #[error("shape {shape:?} holds {expected} elements, but {got} were given")]
    Shape {
        /// The shape.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// The shape's element or byte count overflows `usize`.
    #[error("shape {shape:?} of {dtype} elements is too large to address")]
    TooLarge {
        /// The shape.
        shape: Vec<usize>,
        /// The element type.
        dtype: DataType,
    },
    /// More dimensions than the wire header carries.
    #[error("a tensor may have at most {max} dimensions, this one has {ndim}")]
    TooManyDims {
        /// The number of dimensions given.
        ndim: usize,
        /// The most the header carries.
        max: usize,
    },
    /// The tensor holds another element type than the one asked for.
    #[error("the tensor holds {holds} elements, not {requested}")]
    DType {
        /// What the tensor holds.
        holds: DataType,
        /// What the caller asked for.
        requested: DataType,
    },
    /// Bytes that are not a valid tensor of the type (wrong length, a bool
    /// byte other than 0 or 1).
    #[error("invalid tensor bytes: {0}")]
    Bytes(String),
    /// A device tensor without elements (CUDA allocates no empty buffers).
    #[error("a device tensor holds at least one element; shape {shape:?} holds none")]
    EmptyDevice {
        /// The shape.
        shape: Vec<usize>,
    },
    /// A CUDA call on a device tensor failed (a copy to or from the host).
    #[error("CUDA: {0}")]
    Cuda(String),
}

/// Why a pipeline send, receive or wait failed. Every variant names the
/// tensor, the direction and, where one is involved, the peer rank.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum PipelineError {
    /// The description is inconsistent.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// No tensor of that name is described.
    #[error("no tensor named '{name}' is described in the pipeline")]
    UnknownTensor {
        /// The name asked for.
        name: String,
    },
    /// This rank's stage does not send (or receive) the tensor in that
    /// direction, or the mode has no such direction.
    #[error("rank {rank} (stage {stage}) does not {action} tensor '{name}' {direction}: {why}")]
    WrongStage {
        /// The tensor.
        name: String,
        /// The direction asked for.
        direction: Direction,
        /// "send" or "receive".
        action: &'static str,
        /// This rank.
        rank: usize,
        /// This rank's stage.
        stage: usize,
        /// Why not.
        why: String,
    },
    /// The minibatch is processed by another replica of this stage.
    #[error(
        "minibatch {minibatch} of tensor '{name}' belongs to replica {owner} of stage {stage} \
         (width {width}), not to this rank (replica {index})"
    )]
    NotThisReplica {
        /// The tensor.
        name: String,
        /// The minibatch.
        minibatch: u64,
        /// This stage.
        stage: usize,
        /// Its width.
        width: usize,
        /// The replica that processes the minibatch.
        owner: usize,
        /// This rank's replica index.
        index: usize,
    },
    /// The minibatch is beyond the run's iteration count.
    #[error(
        "minibatch {minibatch} of tensor '{name}' is beyond the run's {iterations} minibatches"
    )]
    MinibatchOutOfRange {
        /// The tensor.
        name: String,
        /// The minibatch.
        minibatch: u64,
        /// Minibatches in the run.
        iterations: u64,
    },
    /// A tensor of another element type than described.
    #[error("tensor '{name}' is described as {expected}, but {direction} {action} carries {got}")]
    DType {
        /// The tensor.
        name: String,
        /// The direction.
        direction: Direction,
        /// "a send" or "a received message".
        action: &'static str,
        /// The described type.
        expected: DataType,
        /// The type met.
        got: DataType,
    },
    /// Sends on one link must go in minibatch order.
    #[error(
        "tensor '{name}' {direction} to rank {peer}: minibatch {got} sent when minibatch \
         {expected} is next on this link (sends to one peer go in minibatch order, each once)"
    )]
    OutOfOrder {
        /// The tensor.
        name: String,
        /// The direction.
        direction: Direction,
        /// The receiving rank.
        peer: usize,
        /// The minibatch due next.
        expected: u64,
        /// The minibatch sent.
        got: u64,
    },
    /// Every minibatch of a link has been sent or received already.
    #[error(
        "tensor '{name}' {direction} with rank {peer}: minibatch {minibatch} was already {action}"
    )]
    AlreadyDone {
        /// The tensor.
        name: String,
        /// The direction.
        direction: Direction,
        /// The peer rank.
        peer: usize,
        /// The minibatch.
        minibatch: u64,
        /// "sent" or "received".
        action: &'static str,
    },
    /// A peer failed, left, or aborted its pipeline.
    #[error(
        "rank {peer} (stage {peer_stage}) failed during tensor '{name}' {direction}{}: {message}",
        at_minibatch(.minibatch)
    )]
    PeerFailed {
        /// The tensor.
        name: String,
        /// The direction.
        direction: Direction,
        /// The failed rank.
        peer: usize,
        /// Its stage.
        peer_stage: usize,
        /// The minibatch in transfer, if known.
        minibatch: Option<u64>,
        /// Its reason, or how its failure showed.
        message: String,
    },
    /// The backend failed.
    #[error(
        "tensor '{name}' {direction} with rank {peer}{}: {source}",
        at_minibatch(.minibatch)
    )]
    Transport {
        /// The tensor.
        name: String,
        /// The direction.
        direction: Direction,
        /// The peer rank.
        peer: usize,
        /// The minibatch in transfer, if known.
        minibatch: Option<u64>,
        /// The backend's error.
        source: TransportError,
    },
    /// A peer sent something that is not what the plan says it sends.
    #[error("tensor '{name}' {direction} from rank {peer}: {message}")]
    Protocol {
        /// The tensor.
        name: String,
        /// The direction.
        direction: Direction,
        /// The sending rank.
        peer: usize,
        /// What was wrong.
        message: String,
    },
    /// A tensor could not be built from what arrived, or read as asked.
    #[error("tensor '{name}': {source}")]
    Tensor {
        /// The tensor.
        name: String,
        /// Why.
        source: TensorError,
    },
    /// `wait` or `finish` found messages that were never sent or received.
    #[error(
        "tensor '{name}' {direction} with rank {peer}: {done} of {expected} minibatches {action}"
    )]
    Incomplete {
        /// The tensor.
        name: String,
        /// The direction.
        direction: Direction,
        /// The peer rank.
        peer: usize,
        /// Messages done.
        done: u64,
        /// Messages the run has on this link.
        expected: u64,
        /// "sent", "received" or "acknowledged".
        action: &'static str,
    },
    /// The serial engine could not send what was queued.
    #[error("sending the queued messages failed: {source}")]
    Flush {
        /// The backend's error.
        source: TransportError,
    },
    /// A device tensor asked to travel where only host tensors do: a
    /// channel that is not NCCL's, or the serial engine.
    #[error(
        "tensor '{name}' {direction}: a device tensor cannot {action} on the channel from \
         rank {sender} to rank {receiver}: {why}"
    )]
    DeviceUnsupported {
        /// The tensor.
        name: String,
        /// The direction.
        direction: Direction,
        /// "travel" for a send, "arrive" for a receive.
        action: &'static str,
        /// The channel's sending rank (global).
        sender: usize,
        /// The channel's receiving rank (global).
        receiver: usize,
        /// Why (which engine or channel it is, what to do instead).
        why: String,
    },
    /// A message arrived in the other memory than the call that takes it:
    /// sent with `send_device` but taken with `recv`, or the reverse. The
    /// message stays queued for the matching call.
    #[error(
        "tensor '{name}' {direction} minibatch {minibatch} from rank {peer} arrived in \
         {arrived} memory; take it with {use_instead}"
    )]
    WrongMemory {
        /// The tensor.
        name: String,
        /// The direction.
        direction: Direction,
        /// The peer (global rank).
        peer: usize,
        /// The minibatch.
        minibatch: u64,
        /// "host" or "device".
        arrived: &'static str,
        /// The call that takes it.
        use_instead: &'static str,
    },
    /// A channel could not be opened or a helper thread not started.
    #[error("could not start the pipeline: {0}")]
    Start(String),
    /// The pipeline was stopped before the operation could complete.
    #[error("the pipeline has shut down")]
    ShutDown,
}

fn at_minibatch(minibatch: &Option<u64>) -> String {
    match minibatch {
        Some(m) => format!(" (minibatch {m})"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_failures_name_the_rank_stage_and_tensor() {
        let err = PipelineError::PeerFailed {
            name: "h1".into(),
            direction: Direction::Forward,
            peer: 2,
            peer_stage: 1,
            minibatch: Some(4),
            message: "aborted: out of memory".into(),
        };
        assert_eq!(
            err.to_string(),
            "rank 2 (stage 1) failed during tensor 'h1' forward (minibatch 4): aborted: out of memory"
        );
    }

    #[test]
    fn plan_errors_name_the_values() {
        let err = PlanError::DuplicateTag {
            tag: 7,
            first: "a".into(),
            second: "b".into(),
        };
        assert_eq!(
            err.to_string(),
            "tag 7 is used by tensor 'a' and by tensor 'b'"
        );
        let err = TensorError::DType {
            holds: DataType::F32,
            requested: DataType::I64,
        };
        assert_eq!(err.to_string(), "the tensor holds f32 elements, not i64");
    }
}
