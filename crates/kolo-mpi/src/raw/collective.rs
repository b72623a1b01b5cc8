//! Collective calls on a communicator.
//!
//! Every function's safety contract includes: `comm` is a live
//! communicator, `dtype` (and `op`) are live and describe `T`, every rank
//! of `comm` makes the same collective calls in the same order with
//! matching counts and root, and count slices hold one entry per rank of
//! `comm`, which the buffers match as each function says.

use super::{check, count, in_place, recv_ptr, send_ptr, Comm, Datatype, Op};
use kolo_transport::Result;
use mpi::ffi;
use std::os::raw::c_int;

/// `MPI_Barrier`.
///
/// # Safety
/// See the module doc.
pub(crate) unsafe fn barrier(comm: Comm) -> Result<()> {
    // SAFETY: `comm` is live (the module's contract).
    check(unsafe { ffi::MPI_Barrier(comm) }, "MPI_Barrier")
}

/// `MPI_Bcast` of `buf` from `root` (in place on every rank).
///
/// # Safety
/// See the module doc; `buf.len()` is the same on every rank.
pub(crate) unsafe fn bcast<T>(
    buf: &mut [T],
    dtype: Datatype,
    root: c_int,
    comm: Comm,
) -> Result<()> {
    let n = count(buf, "MPI_Bcast")?;
    // SAFETY: `buf` holds `n` elements of `dtype`.
    check(
        unsafe { ffi::MPI_Bcast(recv_ptr(buf), n, dtype, root, comm) },
        "MPI_Bcast",
    )
}

/// `MPI_Allreduce` with `MPI_IN_PLACE`: `buf` becomes the reduction of
/// every rank's `buf`.
///
/// # Safety
/// See the module doc; `buf.len()` is the same on every rank.
pub(crate) unsafe fn allreduce_in_place<T>(
    buf: &mut [T],
    dtype: Datatype,
    op: Op,
    comm: Comm,
) -> Result<()> {
    let n = count(buf, "MPI_Allreduce")?;
    // SAFETY: in place over the `n` elements of `dtype` in `buf`.
    check(
        unsafe { ffi::MPI_Allreduce(in_place(), recv_ptr(buf), n, dtype, op, comm) },
        "MPI_Allreduce",
    )
}

/// `MPI_Reduce_scatter`: rank `r` receives into `recv` the reduction of
/// every rank's block `r` of `send`, the blocks being `counts` long.
///
/// # Safety
/// See the module doc; `send.len()` is the sum of `counts` and
/// `recv.len()` this rank's count.
pub(crate) unsafe fn reduce_scatter<T>(
    send: &[T],
    recv: &mut [T],
    counts: &[c_int],
    dtype: Datatype,
    op: Op,
    comm: Comm,
) -> Result<()> {
    // SAFETY: the buffers match `counts` (the caller's contract).
    check(
        unsafe {
            ffi::MPI_Reduce_scatter(
                send_ptr(send),
                recv_ptr(recv),
                counts.as_ptr(),
                dtype,
                op,
                comm,
            )
        },
        "MPI_Reduce_scatter",
    )
}

/// `MPI_Allgather`: every rank's `send` (all of one length), in rank
/// order, into `recv` on every rank.
///
/// # Safety
/// See the module doc; `recv.len()` is the size of `comm` times
/// `send.len()`.
pub(crate) unsafe fn allgather<T>(
    send: &[T],
    recv: &mut [T],
    dtype: Datatype,
    comm: Comm,
) -> Result<()> {
    let n = count(send, "MPI_Allgather")?;
    // SAFETY: `send` holds `n` elements, `recv` room for `n` per rank.
    check(
        unsafe { ffi::MPI_Allgather(send_ptr(send), n, dtype, recv_ptr(recv), n, dtype, comm) },
        "MPI_Allgather",
    )
}

/// `MPI_Allgatherv`: rank `r`'s `send` (`counts[r]` long) at `displs[r]`
/// of `recv` on every rank.
///
/// # Safety
/// See the module doc; `send.len()` is this rank's count and `recv` has
/// room for every block at its displacement.
pub(crate) unsafe fn allgatherv<T>(
    send: &[T],
    recv: &mut [T],
    counts: &[c_int],
    displs: &[c_int],
    dtype: Datatype,
    comm: Comm,
) -> Result<()> {
    let n = count(send, "MPI_Allgatherv")?;
    // SAFETY: the buffers match `counts` and `displs` (the caller's
    // contract).
    check(
        unsafe {
            ffi::MPI_Allgatherv(
                send_ptr(send),
                n,
                dtype,
                recv_ptr(recv),
                counts.as_ptr(),
                displs.as_ptr(),
                dtype,
                comm,
            )
        },
        "MPI_Allgatherv",
    )
}

/// `MPI_Gather`: every rank's `send` (all of one length), in rank order,
/// into `recv` on `root`; `recv` is unused elsewhere.
///
/// # Safety
/// See the module doc; on `root`, `recv.len()` is the size of `comm`
/// times `send.len()`.
pub(crate) unsafe fn gather<T>(
    send: &[T],
    recv: &mut [T],
    dtype: Datatype,
    root: c_int,
    comm: Comm,
) -> Result<()> {
    let n = count(send, "MPI_Gather")?;
    // SAFETY: `send` holds `n` elements; on the root `recv` has room for
    // `n` per rank.
    check(
        unsafe {
            ffi::MPI_Gather(
                send_ptr(send),
                n,
                dtype,
                recv_ptr(recv),
                n,
                dtype,
                root,
                comm,
            )
        },
        "MPI_Gather",
    )
}

/// `MPI_Gatherv`: rank `r`'s `send` at `displs[r]` of `recv` on `root`
/// (`counts` and `displs` are read on the root only).
///
/// # Safety
/// See the module doc; on `root`, `recv` has room for every block
/// (`counts[r]` long) at its displacement.
#[allow(clippy::too_many_arguments)] // MPI's own signature
pub(crate) unsafe fn gatherv<T>(
    send: &[T],
    recv: &mut [T],
    counts: &[c_int],
    displs: &[c_int],
    dtype: Datatype,
    root: c_int,
    comm: Comm,
) -> Result<()> {
    let n = count(send, "MPI_Gatherv")?;
    // SAFETY: the buffers match `counts` and `displs` on the root (the
    // caller's contract).
    check(
        unsafe {
            ffi::MPI_Gatherv(
                send_ptr(send),
                n,
                dtype,
                recv_ptr(recv),
                counts.as_ptr(),
                displs.as_ptr(),
                dtype,
                root,
                comm,
            )
        },
        "MPI_Gatherv",
    )
}

/// `MPI_Alltoallv`: block `r` of `send` (`send_counts[r]` long at
/// `send_displs[r]`) goes to rank `r`, which receives it at
/// `recv_displs[this rank]` of its `recv`.
///
/// # Safety
/// See the module doc; both buffers hold every block at its
/// displacement.
#[allow(clippy::too_many_arguments)] // MPI's own signature
pub(crate) unsafe fn alltoallv<T>(
    send: &[T],
    send_counts: &[c_int],
    send_displs: &[c_int],
    recv: &mut [T],
    recv_counts: &[c_int],
    recv_displs: &[c_int],
    dtype: Datatype,
    comm: Comm,
) -> Result<()> {
    // SAFETY: the buffers match the counts and displacements (the
    // caller's contract).
    check(
        unsafe {
            ffi::MPI_Alltoallv(
                send_ptr(send),
                send_counts.as_ptr(),
                send_displs.as_ptr(),
                dtype,
                recv_ptr(recv),
                recv_counts.as_ptr(),
                recv_displs.as_ptr(),
                dtype,
                comm,
            )
        },
        "MPI_Alltoallv",
    )
}
