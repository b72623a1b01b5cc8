//! Pairwise alltoallv: the own block is copied locally, then `n - 1` steps;
//! at step `s` every rank sends to `rank + s` and receives from `rank - s`,
//! so each step is a permutation and no rank is flooded.

use super::blocks::{check_len, Blocks};
use super::ALLTOALL_TAG;
use crate::element::Element;
use crate::error::{Result, TransportError};
use crate::traits::Collectives;

/// `send` holds `send_counts[p]` elements for each peer p, peer after peer;
/// `recv` receives `recv_counts[p]` elements from each peer p, in peer
/// order. What rank a sends to b must be what b expects from a (a mismatch
/// is an `InvalidArgument` from `recv` on b); `send_counts[rank]` must equal
/// `recv_counts[rank]`.
pub fn pairwise_alltoallv<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    send: &[T],
    send_counts: &[usize],
    recv: &mut [T],
    recv_counts: &[usize],
) -> Result<()> {
    const OP: &str = "alltoallv";
    let (n, rank) = (comm.size(), comm.rank());
    let send_blocks = Blocks::from_counts(OP, "send_counts", send_counts, n)?;
    let recv_blocks = Blocks::from_counts(OP, "recv_counts", recv_counts, n)?;
    check_len(OP, "send", send.len(), send_blocks.total())?;
    check_len(OP, "recv", recv.len(), recv_blocks.total())?;
    if send_counts[rank] != recv_counts[rank] {
        return Err(TransportError::InvalidArgument(format!(
            "{OP}: rank {rank} sends itself {} elements but expects {}",
            send_counts[rank], recv_counts[rank]
        )));
    }

    recv[recv_blocks.range(rank)].copy_from_slice(&send[send_blocks.range(rank)]);
    for step in 1..n {
        let (dst, src) = ((rank + step) % n, (rank + n - step) % n);
        comm.sendrecv(
            &send[send_blocks.range(dst)],
            dst,
            &mut recv[recv_blocks.range(src)],
            src,
            ALLTOALL_TAG,
        )?;
    }
    Ok(())
}
