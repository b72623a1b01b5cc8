//! One entry point per operation. Each is called collectively (every rank,
//! same arguments, same order), runs one case, checks this rank's result
//! against the sequential reference, and agrees with the other ranks on
//! the outcome (one `allgather_bytes`), so that all ranks fail together.
//!
//! Each data-plane check has a host form (`check_allreduce`, for
//! `Collectives` on host memory) and one over any memory
//! (`check_allreduce_on::<M, ..>`): inputs go in with `buffer_from`,
//! results come back with `read_buffer` after `synchronize`.

mod controller;
mod copies;
mod movement;
mod p2p;
mod reductions;
mod transaction;

pub use controller::{
    check_allgather_bytes, check_bitwise_allreduce, check_broadcast_bytes, check_control_barrier,
    check_controller, check_gather_bytes,
};
pub use copies::{check_pack_unpack, check_pack_unpack_on};
pub use movement::{
    check_allgatherv, check_allgatherv_on, check_alltoallv, check_alltoallv_on, check_broadcast,
    check_broadcast_on,
};
pub use p2p::{
    check_barrier, check_barrier_counter, check_barrier_counter_on, check_barrier_on,
    check_send_recv, check_send_recv_on, check_sendrecv, check_sendrecv_on,
};
pub(crate) use reductions::{allreduce_case, allreduce_segments_case, reduce_scatter_case};
pub use reductions::{
    check_allreduce, check_allreduce_on, check_allreduce_segments, check_allreduce_segments_on,
    check_reduce_scatter, check_reduce_scatter_on,
};
pub(crate) use transaction::transaction_case;
pub use transaction::{check_transaction, check_transaction_on};

use crate::failure::{check, Failure};

/// A failure unless `counts` has one entry per rank (checked before any
/// collective, identically on every rank).
pub(crate) fn check_counts(
    case: &str,
    rank: usize,
    counts: &[usize],
    size: usize,
) -> Result<(), Failure> {
    if counts.len() == size {
        Ok(())
    } else {
        Err(check(
            case,
            rank,
            format!("the case passes {} counts for {size} ranks", counts.len()),
        ))
    }
}
