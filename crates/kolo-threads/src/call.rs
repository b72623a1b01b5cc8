//! What a rank says it is doing when it enters a collective: published at
//! the start of every round so that every rank can check that all agree.

use crate::shared::Segment;
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{BitOp, Element, Scale};
use std::any::TypeId;

/// Which collective a rank entered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Allreduce,
    AllreduceSegments,
    Allgatherv,
    Broadcast,
    ReduceScatter,
    Alltoallv,
    Barrier,
    GatherBytes,
    BroadcastBytes,
    AllgatherBytes,
    ControlBarrier,
    BitwiseAllreduce,
}

impl Kind {
    /// The method's name, for error messages.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Kind::Allreduce => "allreduce",
            Kind::AllreduceSegments => "allreduce_segments",
            Kind::Allgatherv => "allgatherv",
            Kind::Broadcast => "broadcast",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Alltoallv => "alltoallv",
            Kind::Barrier => "barrier",
            Kind::GatherBytes => "gather_bytes",
            Kind::BroadcastBytes => "broadcast_bytes",
            Kind::AllgatherBytes => "allgather_bytes",
            Kind::ControlBarrier => "control_barrier",
            Kind::BitwiseAllreduce => "bitwise_allreduce",
        }
    }
}

/// The element type of a data-plane call: the protocol's name and the exact
/// Rust type (two types could claim one `DataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Elem {
    pub dtype: DataType,
    pub type_id: TypeId,
}

impl Elem {
    pub(crate) fn of<T: Element>() -> Self {
        Elem {
            dtype: T::DTYPE,
            type_id: TypeId::of::<T>(),
        }
    }
}

/// The combining operation of a call, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    None,
    Reduce(ReduceOp),
    Bit(BitOp),
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::None => "no operation",
            Op::Reduce(op) => op.name(),
            Op::Bit(BitOp::And) => "bitwise and",
            Op::Bit(BitOp::Or) => "bitwise or",
        }
    }
}

/// One rank's description of the collective it entered (buffers aside).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Call {
    pub kind: Kind,
    pub elem: Option<Elem>,
    pub op: Op,
    pub root: Option<usize>,
    pub scale: Scale,
}

impl Call {
    /// A call with no element type, operation, root or scale.
    pub(crate) fn plain(kind: Kind) -> Self {
        Call {
            kind,
            elem: None,
            op: Op::None,
            root: None,
            scale: Scale::NONE,
        }
    }

    /// A data-plane call on elements of `T`.
    pub(crate) fn of<T: Element>(kind: Kind) -> Self {
        Call {
            elem: Some(Elem::of::<T>()),
            ..Call::plain(kind)
        }
    }

    /// A reduction of `T` with `op` and `scale`.
    pub(crate) fn reduce<T: Element>(kind: Kind, op: ReduceOp, scale: Scale) -> Self {
        Call {
            op: Op::Reduce(op),
            scale,
            ..Call::of::<T>(kind)
        }
    }

    /// With a root rank.
    pub(crate) fn rooted(self, root: usize) -> Self {
        Call {
            root: Some(root),
            ..self
        }
    }
}

/// What every rank can see of one rank's call once all have published:
/// the call, its buffer lengths, its count arrays and its segment table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerArgs<'a> {
    pub call: Call,
    /// Elements in the send (or in-place) buffer.
    pub send_len: usize,
    /// Elements in the receive buffer.
    pub recv_len: usize,
    /// `counts` of allgatherv / reduce_scatter, `send_counts` of alltoallv.
    pub counts: &'a [usize],
    /// `recv_counts` of alltoallv.
    pub recv_counts: &'a [usize],
    /// The segment table of allreduce_segments (only the lengths are
    /// read here).
    pub segments: &'a [Segment],
}

impl PeerArgs<'static> {
    /// Arguments without buffers (for tests and control calls).
    #[cfg(test)]
    pub(crate) fn bare(call: Call) -> Self {
        PeerArgs {
            call,
            send_len: 0,
            recv_len: 0,
            counts: &[],
            recv_counts: &[],
            segments: &[],
        }
    }
}
