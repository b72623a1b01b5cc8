//! What a [`Timeline`](crate::Timeline) handle sends to the writer thread.

/// One call on the timeline, stamped on the calling thread.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Event {
    /// Something that happened to one tensor (lands on the tensor's row).
    Tensor {
        /// Nanoseconds since the timeline was created.
        ts_ns: u64,
        /// The tensor's name (selects the row).
        tensor: String,
        /// What happened.
        action: Action,
    },
    /// The background loop started a cycle (a global instant event).
    CycleStart {
        /// Nanoseconds since the timeline was created.
        ts_ns: u64,
    },
}

/// What happened to a tensor.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    /// Negotiation began; `kind` is the request kind, e.g. `ALLREDUCE`.
    NegotiateStart { kind: String },
    /// `rank`'s request for the tensor arrived.
    RankReady { rank: u32 },
    /// Negotiation ended.
    NegotiateEnd,
    /// The operation began; `op` is its name, e.g. `ALLREDUCE`.
    OpStart { op: String },
    /// The operation ended.
    OpEnd { dtype: String, shape: Vec<u64> },
    /// An activity inside the operation began.
    ActivityStart { activity: String },
    /// The innermost open activity ended.
    ActivityEnd,
}
