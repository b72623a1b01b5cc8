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

// Declared by hand rather than generated: its signature has been the same
// since UCX 1.0, and `ucp_config_t` and `ucs_status_t` come from the
// generated declarations above.
unsafe extern "C" {
    /// `ucp_config_modify`: sets one setting of a UCP configuration (a UCP
    /// name, or a transport's name without its prefix, e.g.
    /// `TX_SEG_SIZE`) as if it had been read from the environment.
    pub fn ucp_config_modify(
        config: *mut ucp_config_t,
        name: *const ::std::os::raw::c_char,
        value: *const ::std::os::raw::c_char,
    ) -> ucs_status_t;
}

/// `UCS_PTR_IS_ERR`: the pointer a non-blocking call returned encodes an
/// error status.
pub fn ptr_is_err(ptr: ucs_status_ptr_t) -> bool {
    (ptr as usize) >= (UCS_ERR_LAST as isize as usize)
}

/// `UCS_PTR_RAW_STATUS`: the status a pointer encodes (for an error).
pub fn ptr_status(ptr: ucs_status_ptr_t) -> ucs_status_t {
    ptr as isize as ucs_status_t
}
