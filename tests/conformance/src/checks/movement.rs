//! The collectives that move data without reducing it: allgatherv,
//! broadcast, alltoallv. Results must match bit for bit.

use super::check_counts;
use crate::buffers::{download, upload, zeroed};
use crate::failure::{agree, check, transport, Failure};
use crate::reference::{check_inputs, Inputs};
use crate::values::{alltoall_count, inputs, salt_of, Values};
use kolo_transport::{Collectives, Controller, Element, Host, Memory};

/// Allgatherv with `counts[r]` elements from rank r (one entry per rank,
/// the same on every rank; zeros allowed); every rank checks every block.
pub fn check_allgatherv<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    counts: &[usize],
) -> Result<(), Failure> {
    check_allgatherv_on::<Host, T, C>(comm, counts)
}

/// [`check_allgatherv`] on memory `M`.
pub fn check_allgatherv_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    counts: &[usize],
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("allgatherv dtype={} counts={counts:?} size={n}", T::DTYPE);
    check_counts(&case, rank, counts, n)?;
    let salt = salt_of(&case);
    let host = inputs::<T>(counts[rank], Values::General, salt, rank, 0);
    let send = upload::<M, T, C>(comm, &case, rank, &host)?;
    let mut out = zeroed::<M, T, C>(comm, &case, rank, counts.iter().sum())?;
    comm.allgatherv(M::view(&send), M::view_mut(&mut out), counts)
        .map_err(transport(&case, rank))?;
    let recv = download::<M, T, C>(comm, &case, rank, &out)?;
    let mut local = Ok(());
    let mut offset = 0;
    for (source, &count) in counts.iter().enumerate() {
        let block = &recv[offset..offset + count];
        let inputs = Inputs {
            values: Values::General,
            salt,
            rank: source,
            start: 0,
        };
        local = local.and_then(|()| check_inputs(&case, rank, offset, block, inputs));
        offset += count;
    }
    agree(comm, &case, local)
}

/// Broadcast of `count` elements from `root` (every other rank starts with
/// different data, which must be overwritten).
pub fn check_broadcast<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    count: usize,
    root: usize,
) -> Result<(), Failure> {
    check_broadcast_on::<Host, T, C>(comm, count, root)
}

/// [`check_broadcast`] on memory `M`.
pub fn check_broadcast_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    count: usize,
    root: usize,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!(
        "broadcast dtype={} count={count} root={root} size={n}",
        T::DTYPE
    );
    if root >= n {
        return Err(check(
            &case,
            rank,
            format!("the case's root {root} is not a rank"),
        ));
    }
    let salt = salt_of(&case);
    // Non-roots start from their own inputs: wrong unless overwritten.
    let host = inputs::<T>(count, Values::General, salt, rank, 0);
    let mut dev = upload::<M, T, C>(comm, &case, rank, &host)?;
    comm.broadcast(M::view_mut(&mut dev), root)
        .map_err(transport(&case, rank))?;
    let buf = download::<M, T, C>(comm, &case, rank, &dev)?;
    let expected = Inputs {
        values: Values::General,
        salt,
        rank: root,
        start: 0,
    };
    let local = check_inputs(&case, rank, 0, &buf, expected);
    agree(comm, &case, local)
}

/// The index at which rank `src`'s block for `dst` starts in the input
/// space of an alltoallv case (blocks never overlap).
fn block_start(dst: usize) -> u64 {
    (dst as u64) << 40
}

/// Alltoallv where rank `src` sends [`alltoall_count`]`(base, src, dst)`
/// elements to rank `dst` (a third of the pairs send nothing); every rank
/// checks every block it receives.
pub fn check_alltoallv<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    base: usize,
) -> Result<(), Failure> {
    check_alltoallv_on::<Host, T, C>(comm, base)
}

/// [`check_alltoallv`] on memory `M`.
pub fn check_alltoallv_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    base: usize,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("alltoallv dtype={} base={base} size={n}", T::DTYPE);
    let salt = salt_of(&case);
    let send_counts: Vec<usize> = (0..n).map(|dst| alltoall_count(base, rank, dst)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|src| alltoall_count(base, src, rank)).collect();
    let mut send = Vec::with_capacity(send_counts.iter().sum());
    for (dst, &count) in send_counts.iter().enumerate() {
        send.extend(inputs::<T>(
            count,
            Values::General,
            salt,
            rank,
            block_start(dst),
        ));
    }
    let send = upload::<M, T, C>(comm, &case, rank, &send)?;
    let mut out = zeroed::<M, T, C>(comm, &case, rank, recv_counts.iter().sum())?;
    comm.alltoallv(
        M::view(&send),
        &send_counts,
        M::view_mut(&mut out),
        &recv_counts,
    )
    .map_err(transport(&case, rank))?;
    let recv = download::<M, T, C>(comm, &case, rank, &out)?;
    let mut local = Ok(());
    let mut offset = 0;
    for (src, &count) in recv_counts.iter().enumerate() {
        let block = &recv[offset..offset + count];
        let inputs = Inputs {
            values: Values::General,
            salt,
            rank: src,
            start: block_start(rank),
        };
        local = local.and_then(|()| check_inputs(&case, rank, offset, block, inputs));
        offset += count;
    }
    agree(comm, &case, local)
}
