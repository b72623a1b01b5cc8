//! Element slices as bytes, for backends that move tensors over byte
//! channels (shared memory, sockets, MPI_BYTE).

use crate::element::Element;
use crate::error::{Result, TransportError};
use kolo_protocol::DataType;

/// The bytes of `buf` (native endianness), `size_of_val(buf)` of them.
pub fn as_bytes<T: Element>(buf: &[T]) -> &[u8] {
    // SAFETY: `Element` types are plain data without padding (the trait's
    // safety contract), so every byte of the slice is initialized; `u8` has
    // alignment 1 and the length is the slice's size in bytes; the borrow
    // keeps `buf` alive and unmodified for the returned lifetime.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), std::mem::size_of_val(buf)) }
}

/// The bytes of `buf` to write into (a receive straight into a tensor),
/// for every element type whose values are all byte patterns: `None` for
/// `bool` (receive its bytes elsewhere and check them with
/// [`copy_from_bytes`]).
pub fn as_bytes_mut<T: Element>(buf: &mut [T]) -> Option<&mut [u8]> {
    if T::DTYPE == DataType::Bool {
        return None;
    }
    // SAFETY: as for `as_bytes`, and any byte pattern is a valid value of
    // every `Element` type but `bool` (refused above), so whatever is
    // written through the bytes leaves valid elements; the mutable borrow
    // is exclusive for the returned lifetime.
    Some(unsafe {
        std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(buf))
    })
}

/// Copies `src` (the bytes of `dst.len()` elements of type `T`, as written
/// by [`as_bytes`]) into `dst`. A length that does not match, or a byte that
/// is not a valid `bool` when `T` is `bool`, is an `InvalidArgument` error.
pub fn copy_from_bytes<T: Element>(dst: &mut [T], src: &[u8]) -> Result<()> {
    let want = std::mem::size_of_val(dst);
    if src.len() != want {
        return Err(TransportError::InvalidArgument(format!(
            "received {} bytes for {} {} elements ({want} bytes)",
            src.len(),
            dst.len(),
            T::DTYPE
        )));
    }
    if T::DTYPE == DataType::Bool {
        if let Some(i) = src.iter().position(|&b| b > 1) {
            return Err(TransportError::InvalidArgument(format!(
                "byte {i} of a bool message is {:#04x}, not 0 or 1",
                src[i]
            )));
        }
    }
    // SAFETY: `dst` is valid for `want` bytes of writes (its own size) and
    // cannot overlap `src` (one is borrowed mutably, the other shared). Any
    // byte pattern is a valid value of every `Element` type except `bool`,
    // whose bytes were checked to be 0 or 1 above.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), want);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn round_trips_every_kind_of_element() {
        let ints = [1i32, -2, 300];
        let mut back = [0i32; 3];
        copy_from_bytes(&mut back, as_bytes(&ints)).unwrap();
        assert_eq!(back, ints);

        let halves = [bf16::from_f32(1.5), bf16::from_f32(-2.0)];
        let mut back = [bf16::ZERO; 2];
        copy_from_bytes(&mut back, as_bytes(&halves)).unwrap();
        assert_eq!(back, halves);

        let bools = [true, false, true];
        let mut back = [false; 3];
        copy_from_bytes(&mut back, as_bytes(&bools)).unwrap();
        assert_eq!(back, bools);
        assert_eq!(as_bytes(&bools), &[1, 0, 1]);
    }

    #[test]
    fn every_type_but_bool_is_writable_as_bytes() {
        let mut ints = [0i32; 2];
        as_bytes_mut(&mut ints)
            .unwrap()
            .copy_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(ints, [1, 2]);
        assert!(as_bytes_mut(&mut [false; 2]).is_none());
    }

    #[test]
    fn rejects_wrong_length_and_invalid_bools() {
        let mut dst = [0u16; 2];
        let err = copy_from_bytes(&mut dst, &[0, 1, 2]).unwrap_err();
        assert!(
            err.to_string()
                .contains("received 3 bytes for 2 u16 elements (4 bytes)"),
            "{err}"
        );

        let mut dst = [false; 2];
        let err = copy_from_bytes(&mut dst, &[1, 7]).unwrap_err();
        assert!(err.to_string().contains("byte 1"), "{err}");
        assert_eq!(dst, [false, false]);
    }
}
