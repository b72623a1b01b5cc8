//! One entry point per operation. Each is called collectively (every rank,
//! same arguments, same order), runs one case, checks this rank's result
//! against the sequential reference, and agrees with the other ranks on
//! the outcome (one `allgather_bytes`), so that all ranks fail together.

mod controller;
mod movement;
mod p2p;
mod reductions;
mod transaction;

pub use controller::{
    check_allgather_bytes, check_bitwise_allreduce, check_broadcast_bytes, check_control_barrier,
    check_controller, check_gather_bytes,
};
pub use movement::{check_allgatherv, check_alltoallv, check_broadcast};
pub use p2p::{check_barrier, check_barrier_counter, check_send_recv, check_sendrecv};
pub use reductions::{check_allreduce, check_allreduce_segments, check_reduce_scatter};
pub use transaction::check_transaction;

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
