//! The receive buffer of the reducing algorithms, reused from call to
//! call on each thread: a fresh zeroed one per call costs a `memset` of up
//! to a segment (and page faults where the allocator maps it), about 6 us
//! at 256 KiB, which is 5% of a 1 MiB allreduce of two processes. What a
//! thread keeps is bounded by [`KEPT_BYTES`]: a longer buffer is made for
//! its call alone, so one large call does not stay with the thread for
//! good.

use super::ring_reduce_scatter::SEGMENT_BYTES;
use crate::element::Element;
use kolo_protocol::DataType;
use std::cell::RefCell;

/// The most a thread keeps: one ring segment, the largest buffer the
/// ring algorithms ask for (the short allreduce asks for less).
const KEPT_BYTES: usize = SEGMENT_BYTES;

thread_local! {
    /// Words, so that the bytes are aligned for every element type.
    static SCRATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a buffer of `len` elements whose values are unspecified
/// (valid, but left from earlier calls): `f` must write before it reads.
/// `bool` (not every byte pattern is a value), nested calls and buffers
/// longer than [`KEPT_BYTES`] get a fresh zeroed buffer.
pub(crate) fn with_scratch<T: Element, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    if T::DTYPE == DataType::Bool
        || std::mem::align_of::<T>() > std::mem::align_of::<u64>()
        || len.saturating_mul(std::mem::size_of::<T>()) > KEPT_BYTES
    {
        return f(&mut vec![T::default(); len]);
    }
    SCRATCH.with(|cell| {
        let Ok(mut words) = cell.try_borrow_mut() else {
            return f(&mut vec![T::default(); len]);
        };
        let bytes = len * std::mem::size_of::<T>();
        let need = bytes.div_ceil(std::mem::size_of::<u64>());
        if words.len() < need {
            words.resize(need, 0);
        }
        // SAFETY: the words hold at least `bytes` initialised bytes, aligned
        // for `T` (checked above); every byte pattern is a valid value of
        // every `Element` type but `bool` (handled above); the `RefCell`
        // borrow makes the slice exclusive while `f` runs.
        let buf = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), len) };
        f(buf)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_have_the_length_asked_and_nest() {
        with_scratch::<f32, _>(1000, |outer| {
            assert_eq!(outer.len(), 1000);
            outer.fill(2.0);
            with_scratch::<f64, _>(3, |inner| {
                assert_eq!(inner, [0.0; 3], "a nested call gets a fresh buffer");
            });
            assert!(outer.iter().all(|&x| x == 2.0));
        });
        with_scratch::<i8, _>(5, |b| assert_eq!(b.len(), 5));
        with_scratch::<bool, _>(4, |b| assert_eq!(b, [false; 4]));
        with_scratch::<u8, _>(0, |b| assert!(b.is_empty()));
    }

    #[test]
    fn a_buffer_longer_than_the_bound_is_not_kept() {
        let kept = || SCRATCH.with(|cell| cell.borrow().len() * std::mem::size_of::<u64>());
        with_scratch::<i32, _>(KEPT_BYTES / 4, |b| b.fill(1));
        assert_eq!(kept(), KEPT_BYTES, "up to the bound, the thread keeps it");
        with_scratch::<i64, _>(KEPT_BYTES / 8 + 1, |b| {
            assert_eq!(b.len(), KEPT_BYTES / 8 + 1);
            assert!(b.iter().all(|&x| x == 0), "a fresh buffer");
        });
        assert_eq!(kept(), KEPT_BYTES, "a longer one is not");
    }
}
