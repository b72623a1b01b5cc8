//! kolo-capi: kolo's C ABI, for framework bindings — Horovod's C surface
//! on kolo's engine. `include/kolo.h` is generated from this crate by
//! cbindgen (and a test checks it still matches).
//!
//! - `kolo_init` starts the engine as the environment says (the `KOLO_*`
//!   settings; the launcher's variables pick the backend: torchrun's or
//!   `kolo-run`'s over UCX, mpirun's over MPI, a process alone on
//!   threads); `kolo_shutdown` stops it on every rank. `kolo_rank`,
//!   `kolo_size`, `kolo_local_rank`, `kolo_local_size` and
//!   `kolo_mpi_threads_supported` return -1 before `kolo_init`.
//! - A tensor is a `kolo_tensor` descriptor (data, data type, shape,
//!   device). The enqueue calls (`kolo_allreduce`, `kolo_grouped_allreduce`,
//!   `kolo_allgather`, `kolo_broadcast`, `kolo_reduce_scatter`,
//!   `kolo_alltoall`) take a name, an optional CUDA stream (the engine's
//!   work follows what was enqueued there) and either a completion
//!   callback or a handle: `kolo_poll`, `kolo_wait` with a timeout,
//!   `kolo_output` for what an allgather or alltoall delivered, and
//!   `kolo_release`.
//! - Every call returns a status (`KOLO_OK`, or a negative `KOLO_ERR_*`);
//!   `kolo_last_error()` gives the text of this thread's last failure,
//!   naming the tensor, the values and the ranks. No panic crosses the
//!   boundary, and every pointer, count and code is checked first.
//!
//! The memory of a tensor must stay valid, and untouched, until its
//! operation completed — as with `MPI_Iallreduce` — even if its handle was
//! released before. The same calls from Rust:
//!
//! ```
//! use kolo_capi::*;
//! use std::ptr::null_mut;
//!
//! // SAFETY: every pointer below is valid for the calls that take it.
//! unsafe {
//!     assert_eq!(kolo_rank(), -1);
//!     assert_eq!(kolo_init(), KOLO_OK); // alone: one rank on threads
//!     let mut grad = [1.5f32; 4];
//!     let shape = [4i64];
//!     let tensor = kolo_tensor {
//!         data: grad.as_mut_ptr().cast(),
//!         dtype: KOLO_FLOAT32,
//!         ndim: 1,
//!         shape: shape.as_ptr(),
//!         device: KOLO_CPU,
//!     };
//!     let mut handle = 0;
//!     let name = c"grad".as_ptr();
//!     let status = kolo_allreduce(name, &tensor, KOLO_SUM, 1.0, 2.0, null_mut(), None, null_mut(), &mut handle);
//!     assert_eq!(status, KOLO_OK);
//!     assert_eq!(kolo_wait(handle, -1.0), KOLO_OK);
//!     assert_eq!(kolo_release(handle), KOLO_OK);
//!     assert_eq!(grad, [3.0; 4]);
//!     assert_eq!(kolo_shutdown(), KOLO_OK);
//! }
//! ```

mod ops;
mod status;
mod table;
mod tensor;

pub use ops::*;
pub use status::*;
pub use tensor::*;

use std::ffi::c_char;
use std::time::Duration;

/// Starts this process's engine from the environment (see
/// `kolo::Kolo::init`): every process of the job calls it once. Calling
/// it again while the engine runs does nothing.
#[no_mangle]
pub extern "C" fn kolo_init() -> i32 {
    guard(|| {
        if table::running().is_some() {
            return Ok(KOLO_OK);
        }
        let config = kolo::Config::from_env()?;
        kolo::init_logging(config.log_level);
        let kolo = kolo::Kolo::init(config)?;
        if !table::install(kolo) {
            // Another thread won the race; its engine serves.
            return Ok(KOLO_OK);
        }
        Ok(KOLO_OK)
    })
}

/// Shuts the engine down on every rank (operations still in flight fail
/// with `KOLO_ERR_SHUT_DOWN`) and waits until this rank's engine stopped.
/// Does nothing without an engine.
#[no_mangle]
pub extern "C" fn kolo_shutdown() -> i32 {
    guard(|| {
        if let Some(kolo) = table::uninstall() {
            kolo.shutdown()?;
        }
        Ok(KOLO_OK)
    })
}

/// This rank, -1 before `kolo_init`.
#[no_mangle]
pub extern "C" fn kolo_rank() -> i32 {
    query(|| table::running().map(|k| k.rank() as i32))
}

/// The number of ranks, -1 before `kolo_init`.
#[no_mangle]
pub extern "C" fn kolo_size() -> i32 {
    query(|| table::running().map(|k| k.size() as i32))
}

/// This rank among the ranks of its host, -1 before `kolo_init`.
#[no_mangle]
pub extern "C" fn kolo_local_rank() -> i32 {
    query(|| table::running().map(|k| k.local_rank() as i32))
}

/// The number of ranks on this host, -1 before `kolo_init`.
#[no_mangle]
pub extern "C" fn kolo_local_size() -> i32 {
    query(|| table::running().map(|k| k.local_size() as i32))
}

/// 1 if MPI granted `MPI_THREAD_MULTIPLE`, 0 if not (or the backend is
/// not MPI), -1 before `kolo_init`.
#[no_mangle]
pub extern "C" fn kolo_mpi_threads_supported() -> i32 {
    query(|| {
        table::running()?;
        #[cfg(feature = "mpi")]
        let granted = kolo::Kolo::mpi_threads_supported().unwrap_or(false);
        #[cfg(not(feature = "mpi"))]
        let granted = false;
        Some(i32::from(granted))
    })
}

/// The text of this thread's last failure (empty before any), naming the
/// tensor, the values and the ranks; valid until this thread's next
/// failing kolo call.
#[no_mangle]
pub extern "C" fn kolo_last_error() -> *const c_char {
    status::last()
}

/// Blocks until every rank entered the barrier.
#[no_mangle]
pub extern "C" fn kolo_barrier() -> i32 {
    guard(|| {
        table::engine()?.barrier()?;
        Ok(KOLO_OK)
    })
}

/// Declares that this rank has no more batches (Horovod's join): until
/// every rank joined, it takes part in the others' collectives with the
/// reduce op's identity. Writes the last rank to join to `last_rank`
/// (unless null).
///
/// # Safety
/// `last_rank` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn kolo_join(last_rank: *mut i32) -> i32 {
    guard(|| {
        let last = table::engine()?.join()?;
        if !last_rank.is_null() {
            // SAFETY: non-null and writable (the contract).
            unsafe { *last_rank = last as i32 };
        }
        Ok(KOLO_OK)
    })
}

/// Frees this rank's fusion buffers now (host and GPU), as
/// `torch.cuda.empty_cache()` empties PyTorch's cache; the next fused
/// operation allocates again. Writes the bytes freed to `freed` (unless
/// null). Local to this rank; operations in flight are not disturbed.
///
/// # Safety
/// `freed` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn kolo_release_buffers(freed: *mut u64) -> i32 {
    guard(|| {
        let bytes = table::engine()?.release_buffers()?;
        if !freed.is_null() {
            // SAFETY: non-null and writable (the contract).
            unsafe { *freed = bytes as u64 };
        }
        Ok(KOLO_OK)
    })
}

/// The status of an outcome, its message left for `kolo_last_error`.
fn status_of(outcome: &table::Outcome) -> Result<i32, Failure> {
    match outcome {
        Ok(_) => Ok(KOLO_OK),
        Err((code, message)) => Err(Failure {
            code: *code,
            message: message.to_string_lossy().into_owned(),
        }),
    }
}

/// `KOLO_IN_PROGRESS` while `handle`'s operation is in flight, then
/// `KOLO_OK` or its error (until released).
#[no_mangle]
pub extern "C" fn kolo_poll(handle: i64) -> i32 {
    guard(|| match table::poll(handle, status_of)? {
        None => Ok(KOLO_IN_PROGRESS),
        Some(status) => status,
    })
}

/// Waits for `handle`'s operation, at most `timeout_seconds` (negative:
/// without a bound): `KOLO_OK` or its error, or `KOLO_TIMED_OUT` with the
/// operation still in flight.
#[no_mangle]
pub extern "C" fn kolo_wait(handle: i64, timeout_seconds: f64) -> i32 {
    guard(|| {
        let timeout = if timeout_seconds < 0.0 || timeout_seconds.is_nan() {
            Duration::MAX
        } else {
            Duration::try_from_secs_f64(timeout_seconds).unwrap_or(Duration::MAX)
        };
        match table::wait(handle, timeout, status_of)? {
            None => Ok(KOLO_TIMED_OUT),
            Some(status) => status,
        }
    })
}

/// Forgets `handle` (its output too). An operation still in flight goes
/// on: its memory must stay valid until it completed on every rank.
#[no_mangle]
pub extern "C" fn kolo_release(handle: i64) -> i32 {
    guard(|| {
        table::release(handle)?;
        Ok(KOLO_OK)
    })
}

/// The text of the error `handle`'s operation failed with (empty while
/// it is in flight or if it succeeded), valid until the handle is
/// released.
#[no_mangle]
pub extern "C" fn kolo_handle_error(handle: i64) -> *const c_char {
    let mut text = std::ptr::null();
    let status = guard(|| {
        text = table::error_text(handle)?;
        Ok(KOLO_OK)
    });
    if status == KOLO_OK && !text.is_null() {
        text
    } else {
        c"".as_ptr()
    }
}

/// Describes what `handle`'s allgather or alltoall delivered in `output`:
/// its data (memory kolo owns, on the input's device), data type, shape
/// and device, all valid until the handle is released.
///
/// # Safety
/// `output` is writable.
#[no_mangle]
pub unsafe extern "C" fn kolo_output(handle: i64, output: *mut kolo_tensor) -> i32 {
    guard(|| {
        if output.is_null() {
            return Err(Failure::invalid(
                "kolo_output: the output descriptor is null",
            ));
        }
        let described = table::output(handle, |out| kolo_tensor {
            data: out.raw.data().cast_mut(),
            dtype: kolo::DataType::ALL
                .iter()
                .position(|&d| d == out.raw.dtype())
                .map_or(-1, |i| i as i32),
            ndim: out.shape.len() as i32,
            shape: out.shape.as_ptr(),
            device: out.raw.device().map_or(KOLO_CPU, |d| d as i32),
        })?;
        // SAFETY: non-null and writable (the contract).
        unsafe { *output = described };
        Ok(KOLO_OK)
    })
}

/// The rows each rank sent to this one in `handle`'s alltoall: `count`
/// values at `splits`, valid until the handle is released.
///
/// # Safety
/// `splits` and `count` are writable.
#[no_mangle]
pub unsafe extern "C" fn kolo_output_splits(
    handle: i64,
    splits: *mut *const i64,
    count: *mut i32,
) -> i32 {
    guard(|| {
        if splits.is_null() || count.is_null() {
            return Err(Failure::invalid("kolo_output_splits: a null out-pointer"));
        }
        let (ptr, n) = table::output(handle, |out| (out.splits.as_ptr(), out.splits.len() as i32))?;
        // SAFETY: both non-null and writable (the contract).
        unsafe {
            *splits = ptr;
            *count = n;
        }
        Ok(KOLO_OK)
    })
}
