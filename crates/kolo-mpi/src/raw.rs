//! The `result` layer (STYLE.md, cudarc's layering): one thin, still-`unsafe`
//! helper per MPI concern that turns status codes into `Result`s. No MPI
//! status code travels past this module.

use kolo_transport::{Result, TransportError};
use mpi::ffi;
use std::os::raw::{c_char, c_int};

/// Turns an MPI return code into a `Result`, with MPI's own error string.
pub(crate) fn check(code: c_int, what: &str) -> Result<()> {
    // SAFETY: reading an MPI-provided constant.
    let success = ffi::MPI_SUCCESS as c_int;
    if code == success {
        return Ok(());
    }
    Err(TransportError::Backend(format!(
        "{what} failed: {} (MPI error {code})",
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

/// A scratch word whose address stands in for empty buffers.
static mut EMPTY: u64 = 0;

/// The address MPI gets for `buf`. An empty Rust slice points at a dangling
/// address equal to its alignment — `1` for bytes, which is OpenMPI's
/// `MPI_IN_PLACE` — so empty buffers get the address of a real word instead.
pub(crate) fn send_ptr<T>(buf: &[T]) -> *const std::os::raw::c_void {
    if buf.is_empty() {
        std::ptr::addr_of!(EMPTY) as *const std::os::raw::c_void
    } else {
        buf.as_ptr() as *const std::os::raw::c_void
    }
}

/// Like [`send_ptr`] for buffers MPI writes. MPI writes nothing through the
/// stand-in address of an empty buffer (its count is 0).
pub(crate) fn recv_ptr<T>(buf: &mut [T]) -> *mut std::os::raw::c_void {
    if buf.is_empty() {
        std::ptr::addr_of_mut!(EMPTY) as *mut std::os::raw::c_void
    } else {
        buf.as_mut_ptr() as *mut std::os::raw::c_void
    }
}
