//! The C ABI's checks on arbitrary tensor descriptors, names, codes and
//! counts (kolo not initialised, so a descriptor that passes is answered
//! "not initialised"): every call returns a status, never panics
//! (KOLO_ERR_INTERNAL) and never reads past what the C contract makes
//! readable.
#![no_main]

use kolo_capi::*;
use libfuzzer_sys::fuzz_target;
use std::ptr::{null, null_mut};

/// Reads a little-endian i32 from `bytes` at `at` (0 past the end).
fn int(bytes: &[u8], at: usize) -> i32 {
    let mut word = [0u8; 4];
    for (i, b) in word.iter_mut().enumerate() {
        *b = bytes.get(at + i).copied().unwrap_or(0);
    }
    i32::from_le_bytes(word)
}

fuzz_target!(|data: &[u8]| {
    let dtype = int(data, 0);
    let ndim = int(data, 4);
    let device = int(data, 8);
    let op = int(data, 12);
    let flags = data.get(16).copied().unwrap_or(0);
    let rest = data.get(17..).unwrap_or(&[]);
    // Up to 2 * KOLO_MAX_DIMS dimensions from the input: more than any
    // accepted ndim reads, as the contract asks of a caller.
    let mut shape = [0i64; 2 * KOLO_MAX_DIMS as usize];
    for (i, chunk) in rest.chunks(8).take(shape.len()).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        shape[i] = i64::from_le_bytes(word);
    }
    // A name buffer of KOLO_MAX_NAME bytes and a NUL: a name without one
    // within the bound is refused before the bound is passed.
    let mut name = vec![0u8; KOLO_MAX_NAME + 1];
    let text = rest.get(shape.len() * 8..).unwrap_or(&[]);
    for (slot, &b) in name.iter_mut().zip(text.iter().take(KOLO_MAX_NAME)) {
        *slot = b;
    }
    if flags & 1 == 0 {
        name[KOLO_MAX_NAME.min(16)] = 0;
    }
    let mut storage = [0u64; 64];
    let tensor = kolo_tensor {
        data: if flags & 2 == 0 {
            storage.as_mut_ptr().cast()
        } else {
            null_mut()
        },
        dtype,
        ndim,
        shape: if flags & 4 == 0 {
            shape.as_ptr()
        } else {
            null()
        },
        device,
    };
    let name_ptr = if flags & 8 == 0 {
        name.as_ptr().cast()
    } else {
        null()
    };
    let tensor_ptr: *const kolo_tensor = if flags & 16 == 0 { &tensor } else { null() };
    let mut handle = 0i64;
    let handle_ptr = if flags & 32 == 0 {
        &mut handle as *mut i64
    } else {
        null_mut()
    };
    let splits = [shape[0], shape[1], shape[2], shape[3]];
    let allowed = |status: i32| {
        assert!(
            status == KOLO_ERR_INVALID_ARGUMENT || status == KOLO_ERR_NOT_INITIALIZED,
            "status {status}: {:?}",
            unsafe { std::ffi::CStr::from_ptr(kolo_last_error()) }
        );
    };
    // SAFETY: every pointer is null or valid for what the contract lets
    // kolo read: the name up to its NUL within KOLO_MAX_NAME + 1 bytes, the
    // shape's 2 * KOLO_MAX_DIMS values, the group's one name and tensor,
    // the splits' four values (nsplits is clamped to them).
    unsafe {
        allowed(kolo_allreduce(
            name_ptr,
            tensor_ptr,
            op,
            1.0,
            1.0,
            null_mut(),
            None,
            null_mut(),
            handle_ptr,
        ));
        allowed(kolo_broadcast(
            name_ptr,
            tensor_ptr,
            op,
            null_mut(),
            None,
            null_mut(),
            handle_ptr,
        ));
        allowed(kolo_allgather(
            name_ptr,
            tensor_ptr,
            null_mut(),
            None,
            null_mut(),
            handle_ptr,
        ));
        let nsplits = (op & 0x7).min(4) - (flags as i32 >> 6 & 1) * 8;
        allowed(kolo_alltoall(
            name_ptr,
            tensor_ptr,
            splits.as_ptr(),
            nsplits,
            null_mut(),
            None,
            null_mut(),
            handle_ptr,
        ));
        let names = [name_ptr];
        let count = if flags & 64 == 0 { 1 } else { -(op & 0xff) };
        allowed(kolo_grouped_allreduce(
            names.as_ptr(),
            tensor_ptr,
            count.min(1),
            op,
            1.0,
            1.0,
            null_mut(),
            None,
            null_mut(),
            handle_ptr,
        ));
        assert_eq!(kolo_rank(), -1);
        assert_eq!(kolo_poll(handle), KOLO_ERR_UNKNOWN_HANDLE);
    }
});
