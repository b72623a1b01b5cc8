//! One thin function per NCCL call: status codes become
//! [`NcclError::Nccl`] here and go no further. Functions taking device
//! pointers or communicators stay `unsafe`; `safe::raw_comm` is the only
//! caller that holds a communicator handle.

use crate::error::NcclError;
use crate::sys::{self, Comm, DataType, NcclResult, RedOp, UniqueId};
use cudarc::driver::sys::CUstream;
use std::ffi::{c_char, c_int, c_void, CStr};

/// Turns NCCL's status `code` of `call` into a `Result`, with NCCL's own
/// description of the error.
fn check(api: &sys::Api, call: &'static str, code: NcclResult) -> Result<(), NcclError> {
    if code == sys::SUCCESS {
        return Ok(());
    }
    Err(NcclError::Nccl {
        call,
        code,
        message: describe(api, code),
    })
}

/// NCCL's text for `code`, followed by its last error message when it has one.
pub(crate) fn describe(api: &sys::Api, code: NcclResult) -> String {
    // SAFETY: ncclGetErrorString accepts any code and returns a pointer to a
    // static NUL-terminated string.
    let text = unsafe { c_text((api.get_error_string)(code)) };
    // SAFETY: ncclGetLastError ignores its argument (NULL is documented as
    // valid) and returns a NUL-terminated thread-local string or NULL.
    let last = unsafe { c_text((api.get_last_error)(std::ptr::null_mut())) };
    if last.is_empty() {
        text
    } else {
        format!("{text}: {last}")
    }
}

/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
unsafe fn c_text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_string_lossy()
        .trim()
        .to_string()
}

/// Where libnccl was loaded from (loading it on first use).
pub fn library_path() -> Result<String, NcclError> {
    Ok(sys::api()?.path.clone())
}

/// `ncclGetVersion`: e.g. 22803 for 2.28.3.
pub fn version() -> Result<i32, NcclError> {
    let api = sys::api()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer for the duration of the call.
    check(api, "ncclGetVersion", unsafe { (api.get_version)(&mut v) })?;
    Ok(v)
}

/// `ncclGetUniqueId`.
pub fn unique_id() -> Result<UniqueId, NcclError> {
    let api = sys::api()?;
    let mut id = UniqueId {
        internal: [0; sys::UNIQUE_ID_BYTES],
    };
    // SAFETY: `id` is a valid, writable ncclUniqueId.
    check(api, "ncclGetUniqueId", unsafe {
        (api.get_unique_id)(&mut id)
    })?;
    Ok(id)
}

/// `ncclCommInitRank` (blocking).
///
/// # Safety
/// The CUDA context of the device this rank uses is current on the calling
/// thread; every rank of `id` calls this with the same `nranks`.
pub unsafe fn comm_init_rank(nranks: c_int, id: UniqueId, rank: c_int) -> Result<Comm, NcclError> {
    let api = sys::api()?;
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: `comm` is a valid out-pointer; the context precondition is the caller's.
    check(api, "ncclCommInitRank", unsafe {
        (api.comm_init_rank)(&mut comm, nranks, id, rank)
    })?;
    Ok(comm)
}

/// One thin `unsafe` wrapper per NCCL call that takes pointers or a
/// communicator and returns only its status (named as its field of
/// [`sys::Api`]): the status becomes a `Result` through [`check`]; the
/// contract is the documented one.
macro_rules! nccl_calls {
    ($(
        $(#[$doc:meta])*
        fn $name:ident $c_name:literal ($($arg:ident: $ty:ty),* $(,)?);
    )*) => {$(
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name($($arg: $ty),*) -> Result<(), NcclError> {
            let api = sys::api()?;
            // SAFETY: per the caller's contract (this function's `# Safety`).
            check(api, $c_name, unsafe { (api.$name)($($arg),*) })
        }
    )*};
}

nccl_calls! {
    /// `ncclCommFinalize`.
    ///
    /// # Safety
    /// `comm` is a live communicator, not used concurrently.
    fn comm_finalize "ncclCommFinalize" (comm: Comm);

    /// `ncclCommDestroy`.
    ///
    /// # Safety
    /// `comm` is a live communicator, never used again.
    fn comm_destroy "ncclCommDestroy" (comm: Comm);

    /// `ncclCommAbort`.
    ///
    /// # Safety
    /// `comm` is a live communicator, never used again.
    fn comm_abort "ncclCommAbort" (comm: Comm);

    /// `ncclAllReduce`.
    ///
    /// # Safety
    /// `send` / `recv` are device memory of `comm`'s device holding `count`
    /// elements of `dtype` (or equal, for in place), alive until the stream
    /// reaches the operation; `op` is valid for `comm`; `stream` is live.
    fn all_reduce "ncclAllReduce" (
        send: *const c_void, recv: *mut c_void, count: usize, dtype: DataType,
        op: RedOp, comm: Comm, stream: CUstream,
    );

    /// `ncclBroadcast`.
    ///
    /// # Safety
    /// As [`all_reduce`]; `send` is read on `root` only.
    fn broadcast "ncclBroadcast" (
        send: *const c_void, recv: *mut c_void, count: usize, dtype: DataType,
        root: c_int, comm: Comm, stream: CUstream,
    );

    /// `ncclReduce`.
    ///
    /// # Safety
    /// As [`all_reduce`]; `recv` is written on `root` only.
    fn reduce "ncclReduce" (
        send: *const c_void, recv: *mut c_void, count: usize, dtype: DataType,
        op: RedOp, root: c_int, comm: Comm, stream: CUstream,
    );

    /// `ncclAllGather`: `send` holds `count` elements, `recv` `count * nranks`.
    ///
    /// # Safety
    /// As [`all_reduce`].
    fn all_gather "ncclAllGather" (
        send: *const c_void, recv: *mut c_void, count: usize, dtype: DataType,
        comm: Comm, stream: CUstream,
    );

    /// `ncclReduceScatter`: `send` holds `count * nranks` elements, `recv` `count`.
    ///
    /// # Safety
    /// As [`all_reduce`].
    fn reduce_scatter "ncclReduceScatter" (
        send: *const c_void, recv: *mut c_void, count: usize, dtype: DataType,
        op: RedOp, comm: Comm, stream: CUstream,
    );

    /// `ncclSend`.
    ///
    /// # Safety
    /// As [`all_reduce`], for `send` only.
    fn send "ncclSend" (
        buf: *const c_void, count: usize, dtype: DataType, peer: c_int, comm: Comm,
        stream: CUstream,
    );

    /// `ncclRecv`.
    ///
    /// # Safety
    /// As [`all_reduce`], for `recv` only.
    fn recv "ncclRecv" (
        buf: *mut c_void, count: usize, dtype: DataType, peer: c_int, comm: Comm,
        stream: CUstream,
    );

    /// `ncclRedOpDestroy`.
    ///
    /// # Safety
    /// `op` was created for the live communicator `comm` and is not used again.
    fn red_op_destroy "ncclRedOpDestroy" (op: RedOp, comm: Comm);
}

/// `ncclCommGetAsyncError`: `Ok(None)` while healthy, `Ok(Some(error))`
/// once NCCL has recorded an asynchronous failure.
///
/// # Safety
/// `comm` is a live communicator (NCCL allows this query from any thread).
pub unsafe fn comm_async_error(comm: Comm) -> Result<Option<NcclError>, NcclError> {
    let api = sys::api()?;
    let mut state: NcclResult = sys::SUCCESS;
    // SAFETY: `state` is a valid out-pointer; `comm` per the caller's contract.
    check(api, "ncclCommGetAsyncError", unsafe {
        (api.comm_get_async_error)(comm, &mut state)
    })?;
    Ok(match state {
        sys::SUCCESS | sys::IN_PROGRESS => None,
        code => Some(NcclError::Nccl {
            call: "asynchronous operation",
            code,
            message: describe(api, code),
        }),
    })
}

/// `ncclGroupStart`.
pub fn group_start() -> Result<(), NcclError> {
    let api = sys::api()?;
    // SAFETY: takes no arguments; only opens this thread's group.
    check(api, "ncclGroupStart", unsafe { (api.group_start)() })
}

/// `ncclGroupEnd`.
pub fn group_end() -> Result<(), NcclError> {
    let api = sys::api()?;
    // SAFETY: takes no arguments; launches the operations of this thread's
    // group, whose pointers their enqueuers vouched for.
    check(api, "ncclGroupEnd", unsafe { (api.group_end)() })
}

/// `ncclRedOpCreatePreMulSum` with a host-immediate scalar: `scalar` holds
/// one value of `dtype` (its first 2, 4 or 8 bytes).
///
/// # Safety
/// `comm` is a live communicator.
pub unsafe fn pre_mul_sum(
    scalar: &mut [u8; 8],
    dtype: DataType,
    comm: Comm,
) -> Result<RedOp, NcclError> {
    let api = sys::api()?;
    let mut op: RedOp = 0;
    // SAFETY: `op` is a valid out-pointer; `scalar` is readable for 8 bytes,
    // enough for any dtype, and host-immediate scalars are read during the
    // call only.
    check(api, "ncclRedOpCreatePreMulSum", unsafe {
        (api.red_op_create_pre_mul_sum)(
            &mut op,
            scalar.as_mut_ptr().cast(),
            dtype,
            sys::SCALAR_HOST_IMMEDIATE,
            comm,
        )
    })?;
    Ok(op)
}
