//! One thin, still `unsafe` function per UCP call kolo makes: each turns
//! UCX's status (or status pointer) into a `Result` naming the call and
//! UCX's own text for the status. No status code travels past this layer.

use crate::sys;
use std::ffi::{c_void, CStr};
use std::ptr;

/// A UCX call that failed: the call, the status and UCX's text for it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {text} (UCX status {status})")]
pub struct UcsError {
    /// The UCP function.
    pub call: &'static str,
    /// UCX's status code (negative).
    pub status: i32,
    /// UCX's text for it.
    pub text: String,
}

impl UcsError {
    /// The error of `status` from `call`.
    pub fn new(call: &'static str, status: sys::ucs_status_t) -> UcsError {
        UcsError {
            call,
            status: status as i32,
            text: status_text(status),
        }
    }

    /// True when the status says a peer or the link to it failed (a dead
    /// process, a reset connection, a timed-out endpoint).
    pub fn is_peer_failure(&self) -> bool {
        let s = self.status;
        (sys::UCS_ERR_LAST_ENDPOINT_FAILURE as i32..=sys::UCS_ERR_FIRST_LINK_FAILURE as i32)
            .contains(&s)
    }
}

/// UCX's text for `status`.
pub fn status_text(status: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string returns a static string for any status.
    let text = unsafe { sys::ucs_status_string(status) };
    if text.is_null() {
        return format!("status {status}");
    }
    // SAFETY: a non-null result is a NUL-terminated static string.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

fn check(call: &'static str, status: sys::ucs_status_t) -> Result<(), UcsError> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(UcsError::new(call, status))
    }
}

/// What a non-blocking call returned: done at once, or a request to wait
/// for.
#[derive(Debug)]
pub enum Started {
    /// Completed at once.
    Done,
    /// In flight: poll with [`request_check_status`], then free it.
    Request(*mut c_void),
}

fn started(call: &'static str, ptr: sys::ucs_status_ptr_t) -> Result<Started, UcsError> {
    if ptr.is_null() {
        Ok(Started::Done)
    } else if sys::ptr_is_err(ptr) {
        Err(UcsError::new(call, sys::ptr_status(ptr)))
    } else {
        Ok(Started::Request(ptr))
    }
}

/// `ucp_config_read` with the default prefix (`UCX_`).
///
/// # Safety
/// The returned config is released with [`config_release`].
pub unsafe fn config_read() -> Result<*mut sys::ucp_config_t, UcsError> {
    let mut config = ptr::null_mut();
    // SAFETY: null prefix and file name read the environment only.
    check("ucp_config_read", unsafe {
        sys::ucp_config_read(ptr::null(), ptr::null(), &mut config)
    })?;
    Ok(config)
}

/// `ucp_config_modify`: sets `name` (without the `UCX_` prefix; a
/// transport's setting also without its transport's, e.g. `TX_SEG_SIZE`
/// for `UCX_TCP_TX_SEG_SIZE`) to `value`. It takes precedence over the
/// environment's value.
///
/// # Safety
/// `config` came from [`config_read`] and is not released yet.
pub unsafe fn config_modify(
    config: *mut sys::ucp_config_t,
    name: &CStr,
    value: &CStr,
) -> Result<(), UcsError> {
    // SAFETY: per the contract; both strings are NUL-terminated and UCX
    // copies them.
    check("ucp_config_modify", unsafe {
        sys::ucp_config_modify(config, name.as_ptr(), value.as_ptr())
    })
}

/// `ucp_config_release`.
///
/// # Safety
/// `config` came from [`config_read`] and is not used afterwards.
pub unsafe fn config_release(config: *mut sys::ucp_config_t) {
    // SAFETY: per the contract.
    unsafe { sys::ucp_config_release(config) }
}

/// `ucp_init` (`ucp_init_version` with the API version of the headers).
///
/// # Safety
/// `params` and `config` are valid for the call; the context is cleaned
/// up with [`cleanup`].
pub unsafe fn init(
    params: &sys::ucp_params_t,
    config: *const sys::ucp_config_t,
) -> Result<sys::ucp_context_h, UcsError> {
    let mut context = ptr::null_mut();
    // SAFETY: per the contract.
    check("ucp_init", unsafe {
        sys::ucp_init_version(
            sys::UCP_API_MAJOR,
            sys::UCP_API_MINOR,
            params,
            config,
            &mut context,
        )
    })?;
    Ok(context)
}

/// `ucp_cleanup`.
///
/// # Safety
/// Every worker of `context` is destroyed; `context` is not used again.
pub unsafe fn cleanup(context: sys::ucp_context_h) {
    // SAFETY: per the contract.
    unsafe { sys::ucp_cleanup(context) }
}

/// `ucp_worker_create`.
///
/// # Safety
/// `context` is live; the worker is destroyed with [`worker_destroy`].
pub unsafe fn worker_create(
    context: sys::ucp_context_h,
    params: &sys::ucp_worker_params_t,
) -> Result<sys::ucp_worker_h, UcsError> {
    let mut worker = ptr::null_mut();
    // SAFETY: per the contract.
    check("ucp_worker_create", unsafe {
        sys::ucp_worker_create(context, params, &mut worker)
    })?;
    Ok(worker)
}

/// `ucp_worker_destroy`.
///
/// # Safety
/// Every endpoint of `worker` is closed; `worker` is not used again.
pub unsafe fn worker_destroy(worker: sys::ucp_worker_h) {
    // SAFETY: per the contract.
    unsafe { sys::ucp_worker_destroy(worker) }
}

/// The worker's address, copied out (`ucp_worker_get_address`, then
/// `ucp_worker_release_address`).
///
/// # Safety
/// `worker` is live.
pub unsafe fn worker_address(worker: sys::ucp_worker_h) -> Result<Vec<u8>, UcsError> {
    let mut address = ptr::null_mut();
    let mut len = 0usize;
    // SAFETY: per the contract; the out-pointers are valid.
    check("ucp_worker_get_address", unsafe {
        sys::ucp_worker_get_address(worker, &mut address, &mut len)
    })?;
    // SAFETY: UCX hands `len` bytes at `address` until released below.
    let bytes = unsafe { std::slice::from_raw_parts(address.cast::<u8>(), len) }.to_vec();
    // SAFETY: the address came from this worker and is released once.
    unsafe { sys::ucp_worker_release_address(worker, address) };
    Ok(bytes)
}

/// `ucp_worker_progress`: the number of events it handled.
///
/// # Safety
/// `worker` is live and no other thread progresses it now.
pub unsafe fn worker_progress(worker: sys::ucp_worker_h) -> u32 {
    // SAFETY: per the contract.
    unsafe { sys::ucp_worker_progress(worker) }
}

/// `ucp_ep_create`.
///
/// # Safety
/// `worker` is live; what `params` points to (the remote address, the
/// error handler's argument) is valid for the call and, for the handler's
/// argument, for the endpoint's life.
pub unsafe fn ep_create(
    worker: sys::ucp_worker_h,
    params: &sys::ucp_ep_params_t,
) -> Result<sys::ucp_ep_h, UcsError> {
    let mut ep = ptr::null_mut();
    // SAFETY: per the contract.
    check("ucp_ep_create", unsafe {
        sys::ucp_ep_create(worker, params, &mut ep)
    })?;
    Ok(ep)
}

/// `ucp_ep_close_nbx`.
///
/// # Safety
/// `ep` is live and not used after the close completed.
pub unsafe fn ep_close(
    ep: sys::ucp_ep_h,
    params: &sys::ucp_request_param_t,
) -> Result<Started, UcsError> {
    // SAFETY: per the contract.
    started("ucp_ep_close_nbx", unsafe {
        sys::ucp_ep_close_nbx(ep, params)
    })
}

/// `ucp_tag_send_nbx` of `len` bytes at `buffer`.
///
/// # Safety
/// `ep` is live; the bytes stay valid and unchanged until the request
/// completed.
pub unsafe fn tag_send(
    ep: sys::ucp_ep_h,
    buffer: *const c_void,
    len: usize,
    tag: u64,
    params: &sys::ucp_request_param_t,
) -> Result<Started, UcsError> {
    // SAFETY: per the contract.
    started("ucp_tag_send_nbx", unsafe {
        sys::ucp_tag_send_nbx(ep, buffer, len, tag, params)
    })
}

/// `ucp_tag_recv_nbx` of at most `len` bytes into `buffer`.
///
/// # Safety
/// `worker` is live; the bytes stay valid and untouched until the request
/// completed or was cancelled and completed.
pub unsafe fn tag_recv(
    worker: sys::ucp_worker_h,
    buffer: *mut c_void,
    len: usize,
    tag: u64,
    mask: u64,
    params: &sys::ucp_request_param_t,
) -> Result<Started, UcsError> {
    // SAFETY: per the contract.
    started("ucp_tag_recv_nbx", unsafe {
        sys::ucp_tag_recv_nbx(worker, buffer, len, tag, mask, params)
    })
}

/// `ucp_tag_probe_nb` with removal: the message's handle and length, if
/// one matching `tag` under `mask` has arrived.
///
/// # Safety
/// `worker` is live; a returned message is received with [`tag_msg_recv`].
pub unsafe fn tag_probe(
    worker: sys::ucp_worker_h,
    tag: u64,
    mask: u64,
) -> Option<(sys::ucp_tag_message_h, usize)> {
    let mut info = sys::ucp_tag_recv_info_t::default();
    // SAFETY: per the contract; `info` is valid.
    let message = unsafe { sys::ucp_tag_probe_nb(worker, tag, mask, 1, &mut info) };
    (!message.is_null()).then_some((message, info.length))
}

/// `ucp_tag_msg_recv_nbx` of a probed message into `buffer`.
///
/// # Safety
/// As [`tag_recv`]; `message` came from [`tag_probe`] and is received once.
pub unsafe fn tag_msg_recv(
    worker: sys::ucp_worker_h,
    buffer: *mut c_void,
    len: usize,
    message: sys::ucp_tag_message_h,
    params: &sys::ucp_request_param_t,
) -> Result<Started, UcsError> {
    // SAFETY: per the contract.
    started("ucp_tag_msg_recv_nbx", unsafe {
        sys::ucp_tag_msg_recv_nbx(worker, buffer, len, message, params)
    })
}

/// `ucp_request_check_status`: `Ok(true)` once complete.
///
/// # Safety
/// `request` is a live request of this process.
pub unsafe fn request_done(request: *mut c_void, call: &'static str) -> Result<bool, UcsError> {
    // SAFETY: per the contract.
    let status = unsafe { sys::ucp_request_check_status(request) };
    match status {
        sys::UCS_INPROGRESS => Ok(false),
        sys::UCS_OK => Ok(true),
        failed => Err(UcsError::new(call, failed)),
    }
}

/// `ucp_tag_recv_request_test`: `Ok(Some(length received))` once a
/// receive completed.
///
/// # Safety
/// `request` is a live receive request of this process.
pub unsafe fn recv_done(request: *mut c_void) -> Result<Option<usize>, UcsError> {
    let mut info = sys::ucp_tag_recv_info_t::default();
    // SAFETY: per the contract; `info` is valid.
    let status = unsafe { sys::ucp_tag_recv_request_test(request, &mut info) };
    match status {
        sys::UCS_INPROGRESS => Ok(None),
        sys::UCS_OK => Ok(Some(info.length)),
        failed => Err(UcsError::new("ucp_tag_recv_nbx", failed)),
    }
}

/// `ucp_request_cancel`.
///
/// # Safety
/// `request` is a live request of `worker`; it completes (cancelled)
/// later and must still be freed.
pub unsafe fn request_cancel(worker: sys::ucp_worker_h, request: *mut c_void) {
    // SAFETY: per the contract.
    unsafe { sys::ucp_request_cancel(worker, request) }
}

/// `ucp_request_free`.
///
/// # Safety
/// `request` completed (or its operation no longer touches user memory)
/// and is not used again.
pub unsafe fn request_free(request: *mut c_void) {
    // SAFETY: per the contract.
    unsafe { sys::ucp_request_free(request) }
}
