//! The enqueue calls: one per collective, each with a name, an optional
//! CUDA stream, and either a completion callback or a handle. Every
//! argument is checked before anything is submitted; an operation
//! refused then leaves nothing behind.

use crate::status::{guard, Failure, KOLO_OK};
use crate::table::{self, outcome};
use crate::tensor::{kolo_tensor, list, name_of, op_of, raw_tensor};
use kolo::raw::RawHandle;
use kolo::{Kolo, ReduceOptions, TensorGroup};
use parking_lot::Mutex;
use std::ffi::{c_char, c_void};

/// A completion callback: called once, on kolo's callback thread (never
/// the engine's), with the operation's handle (valid until the callback
/// returns: read its output there with `kolo_output`), its status
/// (`KOLO_OK` or an error code; `kolo_last_error` on that thread, or
/// `kolo_handle_error`, gives the message) and the `user_data` given.
#[allow(non_camel_case_types)]
pub type kolo_callback =
    Option<unsafe extern "C" fn(handle: i64, status: i32, user_data: *mut c_void)>;

/// The caller's `user_data`, handed back on the callback thread.
struct UserData(*mut c_void);
// SAFETY: kolo never dereferences it; the caller, who gave it for the
// callback thread, vouches for its use there.
unsafe impl Send for UserData {}

/// Where an operation's completion goes.
struct Report {
    callback: kolo_callback,
    user_data: *mut c_void,
    handle: *mut i64,
}

impl Report {
    /// Checks that the result will reach someone.
    fn check(&self, name: &str) -> Result<(), Failure> {
        if self.callback.is_none() && self.handle.is_null() {
            return Err(Failure::invalid(format!(
                "tensor '{name}': neither a callback nor a handle to report the result to"
            )));
        }
        Ok(())
    }

    /// Hands `raw` to the callback or to a new handle.
    ///
    /// # Safety
    /// `handle` is null or writable.
    unsafe fn deliver(self, raw: RawHandle) {
        let Some(callback) = self.callback else {
            let id = table::insert(raw);
            // SAFETY: non-null (checked) and writable (the contract).
            unsafe { *self.handle = id };
            return;
        };
        if !self.handle.is_null() {
            // SAFETY: writable (the contract). With a callback the handle
            // exists only while the callback runs.
            unsafe { *self.handle = 0 };
        }
        let user = UserData(self.user_data);
        raw.on_complete(move |result| {
            let user = user;
            let done = outcome(result);
            let status = match &done {
                Ok(_) => KOLO_OK,
                Err((code, message)) => {
                    crate::status::set_last(&message.to_string_lossy());
                    *code
                }
            };
            let id = table::insert_done(done);
            // SAFETY: the caller's function, called as its type says, once.
            unsafe { callback(id, status, user.0) };
            let _ = table::release(id);
        });
    }
}

/// Checks the report, submits with `submit`, and delivers the handle.
///
/// # Safety
/// `report.handle` is null or writable.
unsafe fn enqueue(
    name: &str,
    report: Report,
    submit: impl FnOnce(&Kolo) -> Result<RawHandle, kolo::Error>,
) -> Result<i32, Failure> {
    report.check(name)?;
    let kolo = table::engine()?;
    let raw = submit(&kolo)?;
    // SAFETY: the caller's contract.
    unsafe { report.deliver(raw) };
    Ok(KOLO_OK)
}

/// Reduces `tensor` across all ranks in place:
/// `postscale * op(prescale * tensor_r)`. `op` is a `KOLO_*` reduce op.
///
/// # Safety
/// `name` is a NUL-terminated string; `tensor` points to a descriptor of
/// memory valid (and left alone) until the operation completed;
/// `handle` is null or writable; `stream` is null or a `CUstream` of the
/// tensor's device.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kolo_allreduce(
    name: *const c_char,
    tensor: *const kolo_tensor,
    op: i32,
    prescale: f64,
    postscale: f64,
    stream: *mut c_void,
    callback: kolo_callback,
    user_data: *mut c_void,
    handle: *mut i64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each pointer.
        let name = unsafe { name_of(name)? };
        let tensor = unsafe { raw_tensor(&name, tensor, stream)? };
        let options = ReduceOptions::new(op_of(&name, op)?)
            .prescale(prescale)
            .postscale(postscale);
        let report = Report {
            callback,
            user_data,
            handle,
        };
        // SAFETY: the caller vouches for the memory until completion.
        unsafe { enqueue(&name, report, |k| k.allreduce_raw(&name, &tensor, options)) }
    })
}

/// Allreduces `count` tensors together (they fuse; every rank passes the
/// same names in the same order), all of one data type and device.
///
/// # Safety
/// As [`kolo_allreduce`], for `count` names and descriptors.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kolo_grouped_allreduce(
    names: *const *const c_char,
    tensors: *const kolo_tensor,
    count: i32,
    op: i32,
    prescale: f64,
    postscale: f64,
    stream: *mut c_void,
    callback: kolo_callback,
    user_data: *mut c_void,
    handle: *mut i64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each pointer.
        let name_ptrs = unsafe { list("the group's names", names, count)? };
        let descriptors = unsafe { list("the group's tensors", tensors, count)? };
        let mut group_names = Vec::with_capacity(name_ptrs.len());
        for &n in name_ptrs {
            // SAFETY: as above.
            group_names.push(unsafe { name_of(n)? });
        }
        let first = group_names.first().cloned().unwrap_or_default();
        let mut raw = Vec::with_capacity(descriptors.len());
        for (name, d) in group_names.iter().zip(descriptors) {
            // SAFETY: as above.
            raw.push(unsafe { raw_tensor(name, d, stream)? });
        }
        let options = ReduceOptions::new(op_of(&first, op)?)
            .prescale(prescale)
            .postscale(postscale);
        let group = group_of(group_names)?;
        let report = Report {
            callback,
            user_data,
            handle,
        };
        // SAFETY: the caller vouches for the memory until completion.
        unsafe {
            enqueue(&first, report, |k| {
                k.allreduce_group_raw(&group, &raw, options)
            })
        }
    })
}

/// Concatenates every rank's `input` along its first dimension (which may
/// differ per rank); the result is the handle's output (`kolo_output`).
///
/// # Safety
/// As [`kolo_allreduce`]; `input` is only read.
#[no_mangle]
pub unsafe extern "C" fn kolo_allgather(
    name: *const c_char,
    input: *const kolo_tensor,
    stream: *mut c_void,
    callback: kolo_callback,
    user_data: *mut c_void,
    handle: *mut i64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each pointer.
        let name = unsafe { name_of(name)? };
        let input = unsafe { raw_tensor(&name, input, stream)? };
        let report = Report {
            callback,
            user_data,
            handle,
        };
        // SAFETY: the caller vouches for the memory until completion.
        unsafe { enqueue(&name, report, |k| k.allgather_raw(&name, &input)) }
    })
}

/// Copies rank `root`'s `tensor` into every rank's `tensor`.
///
/// # Safety
/// As [`kolo_allreduce`].
#[no_mangle]
pub unsafe extern "C" fn kolo_broadcast(
    name: *const c_char,
    tensor: *const kolo_tensor,
    root: i32,
    stream: *mut c_void,
    callback: kolo_callback,
    user_data: *mut c_void,
    handle: *mut i64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each pointer.
        let name = unsafe { name_of(name)? };
        let tensor = unsafe { raw_tensor(&name, tensor, stream)? };
        let root = usize::try_from(root).map_err(|_| {
            Failure::invalid(format!("tensor '{name}': root rank {root} is negative"))
        })?;
        let report = Report {
            callback,
            user_data,
            handle,
        };
        // SAFETY: the caller vouches for the memory until completion.
        unsafe { enqueue(&name, report, |k| k.broadcast_raw(&name, &tensor, root)) }
    })
}

/// Reduces `input` across all ranks and leaves this rank's share of its
/// first dimension in `output` (ranks take the rows in order, the first
/// `rows % size` ranks one more).
///
/// # Safety
/// As [`kolo_allreduce`], for both descriptors (`input` read, `output`
/// written).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kolo_reduce_scatter(
    name: *const c_char,
    input: *const kolo_tensor,
    output: *const kolo_tensor,
    op: i32,
    prescale: f64,
    postscale: f64,
    stream: *mut c_void,
    callback: kolo_callback,
    user_data: *mut c_void,
    handle: *mut i64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each pointer.
        let name = unsafe { name_of(name)? };
        let input = unsafe { raw_tensor(&name, input, stream)? };
        let output = unsafe { raw_tensor(&name, output, stream)? };
        let options = ReduceOptions::new(op_of(&name, op)?)
            .prescale(prescale)
            .postscale(postscale);
        let report = Report {
            callback,
            user_data,
            handle,
        };
        // SAFETY: the caller vouches for the memory until completion.
        unsafe {
            enqueue(&name, report, |k| {
                k.reduce_scatter_raw(&name, &input, &output, options)
            })
        }
    })
}

/// Sends `splits[p]` rows of `input` to each rank p (`nsplits` 0: an even
/// split); what arrived is the handle's output, with the rows from each
/// rank (`kolo_output_splits`).
///
/// # Safety
/// As [`kolo_allreduce`]; `splits` is null or holds `nsplits` readable
/// values.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kolo_alltoall(
    name: *const c_char,
    input: *const kolo_tensor,
    splits: *const i64,
    nsplits: i32,
    stream: *mut c_void,
    callback: kolo_callback,
    user_data: *mut c_void,
    handle: *mut i64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each pointer.
        let name = unsafe { name_of(name)? };
        let input = unsafe { raw_tensor(&name, input, stream)? };
        let given = unsafe { list("the splits", splits, nsplits)? };
        let splits = given
            .iter()
            .map(|&s| usize::try_from(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                Failure::invalid(format!("tensor '{name}': a negative split in {given:?}"))
            })?;
        let report = Report {
            callback,
            user_data,
            handle,
        };
        // SAFETY: the caller vouches for the memory until completion.
        unsafe { enqueue(&name, report, |k| k.alltoall_raw(&name, &input, &splits)) }
    })
}

/// Groups seen, so that a group passed again (a training step) is the same
/// `TensorGroup`, which the engine recognises without reading its names.
const MAX_GROUPS: usize = 64;
static GROUPS: Mutex<Vec<(Vec<String>, TensorGroup)>> = Mutex::new(Vec::new());

/// The group of `names` (the one made before for the same names).
fn group_of(names: Vec<String>) -> Result<TensorGroup, Failure> {
    let mut groups = GROUPS.lock();
    if let Some((_, group)) = groups.iter().find(|(n, _)| *n == names) {
        return Ok(group.clone());
    }
    let group = TensorGroup::new(&names)?;
    if groups.len() == MAX_GROUPS {
        groups.remove(0);
    }
    groups.push((names, group.clone()));
    Ok(group)
}
