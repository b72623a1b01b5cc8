//! CONTRACT (to be implemented by the transport work): generic collective
//! algorithms written once against point-to-point `send` / `recv`, so a
//! backend that only has point-to-point gets every collective.
//!
//! Planned API: a `PointToPoint` trait (Topology + send + recv of typed
//! slices) and free functions `ring_allreduce`, `ring_allgatherv`,
//! `ring_reduce_scatter`, `tree_broadcast`, `pairwise_alltoallv`,
//! `dissemination_barrier`, plus a `P2pCollectives<P>` adapter that
//! implements `Collectives` for any `PointToPoint`.
