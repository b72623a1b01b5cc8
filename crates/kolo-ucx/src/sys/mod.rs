//! The raw UCP API: declarations generated from the installed
//! `<ucp/api/ucp.h>` by `build.rs` (only what kolo calls), and the
//! status-pointer conventions that the header defines as macros. Nothing
//! here is safe to call; [`crate::result`] wraps each call.

#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all
)]

include!(concat!(env!("OUT_DIR"), "/ucp.rs"));

/// `UCS_PTR_IS_ERR`: the pointer a non-blocking call returned encodes an
/// error status.
pub fn ptr_is_err(ptr: ucs_status_ptr_t) -> bool {
    (ptr as usize) >= (UCS_ERR_LAST as isize as usize)
}

/// `UCS_PTR_RAW_STATUS`: the status a pointer encodes (for an error).
pub fn ptr_status(ptr: ucs_status_ptr_t) -> ucs_status_t {
    ptr as isize as ucs_status_t
}
