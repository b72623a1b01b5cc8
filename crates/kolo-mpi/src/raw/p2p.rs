//! Point-to-point calls: blocking send, probe, receive and send-receive,
//! and non-blocking sends and receives completed together.
//!
//! Every function's safety contract includes: `comm` is a live
//! communicator and `dtype` describes `T` (a datatype of `T`'s size and
//! layout, live until the call — or, for non-blocking calls, its request —
//! completes).

use super::{check, count, recv_ptr, send_ptr, Comm, Datatype, Request, Status};
use kolo_transport::Result;
use mpi::ffi;
use std::os::raw::c_int;

/// `MPI_Send` of `buf` to rank `dest` of `comm`.
///
/// # Safety
/// See the module doc.
pub(crate) unsafe fn send<T>(
    buf: &[T],
    dtype: Datatype,
    dest: c_int,
    tag: c_int,
    comm: Comm,
) -> Result<()> {
    let n = count(buf, "MPI_Send")?;
    // SAFETY: `buf` holds `n` elements of `dtype` (the module's contract).
    check(
        unsafe { ffi::MPI_Send(send_ptr(buf), n, dtype, dest, tag, comm) },
        "MPI_Send",
    )
}

/// `MPI_Probe`: waits for a message from `source` with `tag` and says what
/// it holds, without receiving it.
///
/// # Safety
/// `comm` is a live communicator.
pub(crate) unsafe fn probe(source: c_int, tag: c_int, comm: Comm) -> Result<Status> {
    // SAFETY: MPI_Status is plain C data that MPI_Probe overwrites.
    let mut status: Status = unsafe { std::mem::zeroed() };
    // SAFETY: `comm` is live, `status` a valid out-slot.
    check(
        unsafe { ffi::MPI_Probe(source, tag, comm, &mut status) },
        "MPI_Probe",
    )?;
    Ok(status)
}

/// `MPI_Get_count`: how many elements of `dtype` the probed message holds.
///
/// # Safety
/// `status` comes from [`probe`]; `dtype` is a live datatype.
pub(crate) unsafe fn get_count(status: &Status, dtype: Datatype) -> Result<c_int> {
    let mut n: c_int = 0;
    // SAFETY: `status` was filled by MPI_Probe, `n` a valid out-slot.
    check(
        unsafe { ffi::MPI_Get_count(status, dtype, &mut n) },
        "MPI_Get_count",
    )?;
    Ok(n)
}

/// `MPI_Recv` of `buf.len()` elements from `source` into `buf`.
///
/// # Safety
/// See the module doc.
pub(crate) unsafe fn recv<T>(
    buf: &mut [T],
    dtype: Datatype,
    source: c_int,
    tag: c_int,
    comm: Comm,
) -> Result<()> {
    let n = count(buf, "MPI_Recv")?;
    // SAFETY: `buf` has room for `n` elements of `dtype`; the status is
    // ignored (MPI's predefined placeholder).
    check(
        unsafe {
            ffi::MPI_Recv(
                recv_ptr(buf),
                n,
                dtype,
                source,
                tag,
                comm,
                ffi::RSMPI_STATUS_IGNORE,
            )
        },
        "MPI_Recv",
    )
}

/// `MPI_Sendrecv`: sends `send` to `dest` and receives `recv.len()`
/// elements from `source` into `recv`, both with `tag`.
///
/// # Safety
/// See the module doc.
#[allow(clippy::too_many_arguments)] // MPI's own signature
pub(crate) unsafe fn sendrecv<T>(
    send: &[T],
    dest: c_int,
    recv: &mut [T],
    source: c_int,
    dtype: Datatype,
    tag: c_int,
    comm: Comm,
) -> Result<()> {
    let (sn, rn) = (count(send, "MPI_Sendrecv")?, count(recv, "MPI_Sendrecv")?);
    // SAFETY: the buffers hold `sn` and have room for `rn` elements of
    // `dtype`; the status is ignored.
    check(
        unsafe {
            ffi::MPI_Sendrecv(
                send_ptr(send),
                sn,
                dtype,
                dest,
                tag,
                recv_ptr(recv),
                rn,
                dtype,
                source,
                tag,
                comm,
                ffi::RSMPI_STATUS_IGNORE,
            )
        },
        "MPI_Sendrecv",
    )
}

/// `MPI_Isend` of `buf` to `dest`; [`waitall`] completes it.
///
/// # Safety
/// See the module doc; also, `buf` stays alive and unmodified until the
/// request completes.
pub(crate) unsafe fn isend<T>(
    buf: &[T],
    dtype: Datatype,
    dest: c_int,
    tag: c_int,
    comm: Comm,
) -> Result<Request> {
    let n = count(buf, "MPI_Isend")?;
    // SAFETY: MPI_Request is a plain C handle that MPI_Isend overwrites.
    let mut req: Request = unsafe { std::mem::zeroed() };
    // SAFETY: `buf` holds `n` elements of `dtype` and outlives the request
    // (the caller's contract); `req` is a valid out-slot.
    check(
        unsafe { ffi::MPI_Isend(send_ptr(buf), n, dtype, dest, tag, comm, &mut req) },
        "MPI_Isend",
    )?;
    Ok(req)
}

/// `MPI_Irecv` of `buf.len()` elements from `source` into `buf`;
/// [`waitall`] completes it.
///
/// # Safety
/// See the module doc; also, `buf` stays alive and untouched until the
/// request completes.
pub(crate) unsafe fn irecv<T>(
    buf: &mut [T],
    dtype: Datatype,
    source: c_int,
    tag: c_int,
    comm: Comm,
) -> Result<Request> {
    let n = count(buf, "MPI_Irecv")?;
    // SAFETY: MPI_Request is a plain C handle that MPI_Irecv overwrites.
    let mut req: Request = unsafe { std::mem::zeroed() };
    // SAFETY: `buf` has room for `n` elements of `dtype` and outlives the
    // request (the caller's contract); `req` is a valid out-slot.
    check(
        unsafe { ffi::MPI_Irecv(recv_ptr(buf), n, dtype, source, tag, comm, &mut req) },
        "MPI_Irecv",
    )?;
    Ok(req)
}

/// `MPI_Waitall`: completes every request.
///
/// # Safety
/// Every request came from [`isend`] or [`irecv`] and is completed once.
pub(crate) unsafe fn waitall(requests: &mut [Request]) -> Result<()> {
    let n = count(requests, "MPI_Waitall")?;
    // SAFETY: `requests` holds `n` live requests; statuses are ignored.
    check(
        unsafe { ffi::MPI_Waitall(n, requests.as_mut_ptr(), ffi::RSMPI_STATUSES_IGNORE) },
        "MPI_Waitall",
    )
}
