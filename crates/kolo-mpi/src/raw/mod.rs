//! The `result` layer (STYLE.md, cudarc's layering): one thin, still-`unsafe`
//! function per MPI call kolo-mpi makes, which turns MPI's status code into a
//! [`Result`] naming the call. Everything else in the crate calls MPI through
//! here (or through rsmpi's safe API): no `mpi::ffi` item, status code or
//! buffer pointer travels past this module.
//!
//! Buffers are Rust slices. The functions are `unsafe` because MPI cannot
//! check what they are given: the datatype must describe the slice's
//! element type, the handles must be live, and every rank of a
//! communicator must make the same collective calls in the same order.
//!
//! - [`comm`]: communicators (duplicate, split, rank and size, free, abort).
//! - [`datatype`]: derived datatypes, user operations and MPI's predefined
//!   ones.
//! - [`p2p`]: point-to-point messages, blocking and non-blocking.
//! - [`collective`]: the collectives on a communicator.

pub(crate) mod collective;
pub(crate) mod comm;
pub(crate) mod datatype;
pub(crate) mod p2p;

use kolo_transport::{Result, TransportError};
use mpi::ffi;
use std::os::raw::{c_char, c_int, c_void};

/// A communicator handle (`MPI_Comm`).
pub(crate) type Comm = ffi::MPI_Comm;
/// A datatype handle (`MPI_Datatype`).
pub(crate) type Datatype = ffi::MPI_Datatype;
/// A reduction operation handle (`MPI_Op`).
pub(crate) type Op = ffi::MPI_Op;
/// A pending non-blocking operation (`MPI_Request`).
pub(crate) type Request = ffi::MPI_Request;
/// What a probe learnt of a message (`MPI_Status`).
pub(crate) type Status = ffi::MPI_Status;
/// A user reduction function (`MPI_User_function`).
pub(crate) type UserFunction = ffi::MPI_User_function;

extern "C" {
    // kolo-mpi's C shim (src/shim.c): values MPI defines as macros.
    fn kolo_mpi_in_place() -> *mut c_void;
    fn kolo_mpi_tag_ub_key() -> c_int;
}

/// Turns an MPI return code into a `Result`, with MPI's own error string.
fn check(code: c_int, call: &str) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    Err(TransportError::Backend(format!(
        "{call} failed: {} (MPI error {code})",
        error_string(code)
    )))
}

fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds MPI_MAX_ERROR_STRING characters as the call requires;
    // MPI_Error_string may be called at any time, even before init.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return "unknown error".into();
    }
    let bytes: Vec<u8> = buf[..len.max(0) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A count or displacement as MPI's `int`, or an error naming the value.
pub(crate) fn to_int(value: usize, what: &str) -> Result<c_int> {
    c_int::try_from(value).map_err(|_| {
        TransportError::InvalidArgument(format!(
            "{what} of {value} elements exceeds MPI's int limit ({})",
            c_int::MAX
        ))
    })
}

/// Counts and displacements as MPI ints.
pub(crate) fn counts_displs(counts: &[usize], what: &str) -> Result<(Vec<c_int>, Vec<c_int>)> {
    let mut c = Vec::with_capacity(counts.len());
    let mut d = Vec::with_capacity(counts.len());
    let mut offset = 0usize;
    for &n in counts {
        c.push(to_int(n, what)?);
        d.push(to_int(offset, what)?);
        offset += n;
    }
    Ok((c, d))
}

/// A slice's length as MPI's `int` count.
fn count<T>(buf: &[T], call: &str) -> Result<c_int> {
    to_int(buf.len(), call)
}

/// A scratch word whose address stands in for empty buffers.
static mut EMPTY: u64 = 0;

/// The address MPI gets for `buf`. An empty Rust slice points at a dangling
/// address equal to its alignment — `1` for bytes, which is OpenMPI's
/// `MPI_IN_PLACE` — so empty buffers get the address of a real word instead.
fn send_ptr<T>(buf: &[T]) -> *const c_void {
    if buf.is_empty() {
        std::ptr::addr_of!(EMPTY) as *const c_void
    } else {
        buf.as_ptr() as *const c_void
    }
}

/// Like [`send_ptr`] for buffers MPI writes. MPI writes nothing through the
/// stand-in address of an empty buffer (its count is 0).
fn recv_ptr<T>(buf: &mut [T]) -> *mut c_void {
    if buf.is_empty() {
        std::ptr::addr_of_mut!(EMPTY) as *mut c_void
    } else {
        buf.as_mut_ptr() as *mut c_void
    }
}

/// `MPI_IN_PLACE`, read through the shim (its value differs between MPIs).
fn in_place() -> *mut c_void {
    // SAFETY: the shim returns MPI's constant; it touches no state.
    unsafe { kolo_mpi_in_place() }
}
