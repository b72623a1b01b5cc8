//! [`Worker`]: a UCP context with the tag-matching feature and its one
//! worker (a communicator's), destroyed in order on drop; and
//! [`Endpoint`]s to peers, each with UCX's peer error handling so that a
//! dead peer becomes an error rather than a hang.

use crate::result::{self, Started, UcsError};
use crate::sys;
use crate::tuning::{self, Setting};
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A UCP context and its worker.
#[derive(Debug)]
pub struct Worker {
    context: sys::ucp_context_h,
    worker: sys::ucp_worker_h,
}

// SAFETY: the worker is created in UCS_THREAD_MODE_SERIALIZED: any thread
// may use it, one at a time, which `&mut` access through its owner (one
// communicator) guarantees.
unsafe impl Send for Worker {}

impl Worker {
    /// A context with tag matching (configured from `UCX_*` variables, and
    /// kolo's settings where they leave UCX's defaults: see
    /// [`crate::tuning`]; `across_hosts`: the job's ranks span hosts) and
    /// its worker.
    pub fn new(across_hosts: bool) -> Result<Worker, UcsError> {
        // SAFETY: the config is released below, after the context is made.
        let config = unsafe { result::config_read() }?;
        let settings = tuning::settings(|name| std::env::var(name).ok(), across_hosts);
        if let Err(e) = apply(config, &settings) {
            // SAFETY: the config is not used again.
            unsafe { result::config_release(config) };
            return Err(e);
        }
        let params = sys::ucp_params_t {
            field_mask: sys::UCP_PARAM_FIELD_FEATURES as u64,
            features: sys::UCP_FEATURE_TAG as u64,
            ..Default::default()
        };
        // SAFETY: `params` and `config` are valid for the call.
        let context = unsafe { result::init(&params, config) };
        // SAFETY: the config is not used again.
        unsafe { result::config_release(config) };
        let context = context?;
        let params = sys::ucp_worker_params_t {
            field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
            thread_mode: sys::UCS_THREAD_MODE_SERIALIZED,
            ..Default::default()
        };
        // SAFETY: the context is live; the worker is destroyed on drop,
        // before the context.
        match unsafe { result::worker_create(context, &params) } {
            Ok(worker) => Ok(Worker { context, worker }),
            Err(e) => {
                // SAFETY: the context has no worker and is not used again.
                unsafe { result::cleanup(context) };
                Err(e)
            }
        }
    }

    /// The worker's address, for peers to connect to.
    pub fn address(&self) -> Result<Vec<u8>, UcsError> {
        // SAFETY: the worker is live.
        unsafe { result::worker_address(self.worker) }
    }

    /// Progresses the worker; the number of events handled.
    pub fn progress(&mut self) -> u32 {
        // SAFETY: the worker is live, and `&mut self` keeps other threads
        // from progressing it at the same time.
        unsafe { result::worker_progress(self.worker) }
    }

    pub(crate) fn raw(&self) -> sys::ucp_worker_h {
        self.worker
    }
}

/// Sets each of `settings` in `config`.
fn apply(config: *mut sys::ucp_config_t, settings: &[Setting]) -> Result<(), UcsError> {
    for &(name, value) in settings {
        // SAFETY: `config` came from `config_read` and is released only
        // after this; UCX copies both strings.
        unsafe { result::config_modify(config, name, value) }?;
    }
    Ok(())
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SAFETY: the endpoints were closed by their owner first (the
        // communicator drops them before the worker); the worker, then
        // the context, are not used again.
        unsafe {
            result::worker_destroy(self.worker);
            result::cleanup(self.context);
        }
    }
}

/// The order in which peers failed (their error handlers ran), across
/// every endpoint of the process.
static FAILURES: AtomicU64 = AtomicU64::new(0);

/// What the error handler of an endpoint records.
#[derive(Debug, Default)]
pub struct PeerState {
    failed: AtomicBool,
    status: AtomicI32,
    /// Its place in [`FAILURES`]' order (valid once `failed`).
    order: AtomicU64,
}

impl PeerState {
    /// When it failed, relative to other peers (smaller: earlier).
    pub fn failed_at(&self) -> Option<u64> {
        self.failed
            .load(Ordering::Acquire)
            .then(|| self.order.load(Ordering::Acquire))
    }

    /// The failure UCX reported on the endpoint, if any.
    pub fn failure(&self) -> Option<UcsError> {
        self.failed.load(Ordering::Acquire).then(|| {
            UcsError::new(
                "the endpoint's error handler",
                self.status.load(Ordering::Acquire) as sys::ucs_status_t,
            )
        })
    }
}

unsafe extern "C" fn on_peer_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    // SAFETY: `arg` is the endpoint's `PeerState`, which the endpoint
    // keeps alive until after it closed.
    let state = unsafe { &*arg.cast::<PeerState>() };
    state.status.store(status as i32, Ordering::Release);
    state
        .order
        .store(FAILURES.fetch_add(1, Ordering::AcqRel), Ordering::Release);
    state.failed.store(true, Ordering::Release);
}

/// A connection to one peer's worker.
#[derive(Debug)]
pub struct Endpoint {
    ep: sys::ucp_ep_h,
    state: Arc<PeerState>,
}

// SAFETY: used only through its communicator, by one thread at a time
// (the worker is SERIALIZED).
unsafe impl Send for Endpoint {}

impl Endpoint {
    /// Connects `worker` to the worker whose address is `address`; with
    /// `peer_errors`, in UCX's peer error handling mode, where a dead peer
    /// fails the endpoint (and calls its handler) instead of hanging it.
    /// The shared-memory transports alone do not offer that mode.
    pub fn connect(
        worker: &Worker,
        address: &[u8],
        peer_errors: bool,
    ) -> Result<Endpoint, UcsError> {
        let state = Arc::new(PeerState::default());
        let mut params = sys::ucp_ep_params_t {
            field_mask: sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS as u64,
            address: address.as_ptr().cast(),
            ..Default::default()
        };
        if peer_errors {
            params.field_mask |= (sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64;
            params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
            params.err_handler = sys::ucp_err_handler_t {
                cb: Some(on_peer_error),
                arg: Arc::as_ptr(&state).cast_mut().cast(),
            };
        }
        // SAFETY: the worker is live; `address` is valid for the call; the
        // handler's argument is the shared state, which the endpoint keeps
        // until after it is closed.
        let ep = unsafe { result::ep_create(worker.raw(), &params) }?;
        Ok(Endpoint { ep, state })
    }

    /// What the peer's error handler records.
    pub fn state(&self) -> &Arc<PeerState> {
        &self.state
    }

    pub(crate) fn raw(&self) -> sys::ucp_ep_h {
        self.ep
    }

    /// Closes the endpoint: flushed when the peer is healthy, forced when
    /// it failed (or when `force`); waits at most `bound` for the close,
    /// progressing `worker`.
    pub fn close(self, worker: &mut Worker, force: bool, bound: Duration) {
        let force = force || self.state.failure().is_some();
        let params = sys::ucp_request_param_t {
            op_attr_mask: if force {
                sys::UCP_OP_ATTR_FIELD_FLAGS
            } else {
                0
            },
            flags: if force {
                sys::UCP_EP_CLOSE_FLAG_FORCE
            } else {
                0
            },
            ..Default::default()
        };
        // SAFETY: the endpoint is live and not used after this.
        let started = unsafe { result::ep_close(self.ep, &params) };
        if let Ok(Started::Request(request)) = started {
            let deadline = Instant::now() + bound;
            loop {
                worker.progress();
                // SAFETY: a live request of this process.
                let done = unsafe { result::request_done(request, "ucp_ep_close_nbx") };
                if !matches!(done, Ok(false)) || Instant::now() >= deadline {
                    break;
                }
            }
            // SAFETY: the close completed, or it no longer touches user
            // memory (an endpoint close has none).
            unsafe { result::request_free(request) };
        }
        // The state goes last: UCX does not call the handler on a closed
        // endpoint.
        drop(self.state);
    }
}

/// A null request parameter set: no callback, bytes as the datatype.
pub(crate) fn plain_params() -> sys::ucp_request_param_t {
    sys::ucp_request_param_t::default()
}

/// A null pointer for an empty buffer (UCX takes none for zero bytes).
pub(crate) fn buffer_ptr(bytes: &[u8]) -> *const c_void {
    if bytes.is_empty() {
        ptr::null()
    } else {
        bytes.as_ptr().cast()
    }
}
