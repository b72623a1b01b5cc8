//! The element kernels: how each dtype is reduced, scaled and converted.
//!
//! [`Element`] is implemented for `u8`, `i8`, `u16`, `i16`, `i32`, `i64`,
//! [`half::f16`], [`half::bf16`], `f32`, `f64` and `bool`.
//!
//! # Semantics per type
//!
//! | type        | sum / average | product      | min / max        | scale                         |
//! |-------------|---------------|--------------|------------------|-------------------------------|
//! | integers    | wrapping add  | wrapping mul | natural order    | in f64, toward zero, saturate |
//! | f32, f64    | IEEE add      | IEEE mul     | `min` / `max`¹   | in the type's precision       |
//! | f16, bf16   | through f32   | through f32  | through f32¹     | through f32                   |
//! | bool        | OR            | AND          | AND / OR         | unchanged unless factor is 0  |
//!
//! ¹ IEEE `minNum` / `maxNum`: a NaN loses against a number.
//!
//! `Average` reduces as `Sum`; the division by the number of ranks is a
//! scale applied afterwards ([`crate::Scale::postscale_for`]). For integers
//! that means: wrapping sum, then multiply by `postscale / n` in f64 and
//! round toward zero (so `[1, 2]` averaged over two ranks gives `1`).
//!
//! The kernels are written as one loop per operation over zipped slices (the
//! operation is matched once, outside the loop), so they vectorize. f16 and
//! bf16 work on blocks of [`HALF_BLOCK`] elements converted to f32 on the
//! stack: [`Element::reduce_many`] accumulates every source in f32 and rounds
//! once per element.

mod kernels;
#[cfg(test)]
mod tests;
mod widen;

use kolo_protocol::{DataType, ReduceOp};

/// Elements per stack block when f16 / bf16 are converted to f32.
pub const HALF_BLOCK: usize = 256;

/// A tensor element kolo can move and reduce.
///
/// # Safety
/// Implementors are plain data: `Copy`, no padding, no pointers, so a
/// backend may move them as bytes. (`bool` is included: kolo only ever
/// writes bytes that were valid `bool`s; see [`crate::byte_view`].)
pub unsafe trait Element:
    Copy + Send + Sync + PartialEq + std::fmt::Debug + Default + 'static
{
    /// The protocol's name for this type.
    const DTYPE: DataType;

    /// The neutral element of `op`: `reduce(identity, x) == x`. Sum and
    /// average: 0; product: 1; min: the type's maximum (+inf for floats);
    /// max: the type's minimum (-inf for floats). bool: sum (OR) and max
    /// (OR) `false`, product (AND) and min (AND) `true`. Ranks that have
    /// joined contribute it.
    fn identity(op: ReduceOp) -> Self;

    /// `acc[i] = op(acc[i], src[i])` for every i. `Average` reduces as `Sum`
    /// (the division is a scale applied afterwards). Vectorizes for the
    /// native numeric types.
    ///
    /// # Panics
    /// If the lengths differ: a kolo bug, never user input (callers check
    /// lengths first).
    fn reduce_into(acc: &mut [Self], src: &[Self], op: ReduceOp);

    /// `dst[i] = op(a[i], b[i])` for every i, in one pass (the native types
    /// override the default, a copy then [`Element::reduce_into`]).
    ///
    /// # Panics
    /// If the lengths differ (a kolo bug, as above).
    fn reduce_pair(dst: &mut [Self], a: &[Self], b: &[Self], op: ReduceOp) {
        dst.copy_from_slice(a);
        Self::reduce_into(dst, b, op);
    }

    /// `dst[i] = op(srcs[0][i], srcs[1][i], ...)`. f16 / bf16 accumulate in
    /// f32 and round once. `Average` reduces as `Sum`. With no sources `dst`
    /// is filled with [`Element::identity`].
    ///
    /// # Panics
    /// If a source's length differs from `dst`'s (a kolo bug, as above).
    fn reduce_many(dst: &mut [Self], srcs: &[&[Self]], op: ReduceOp);

    /// `buf[i] *= factor`. Floats multiply in their own precision (f16/bf16
    /// through f32); integers multiply in f64 and round toward zero,
    /// saturating at the type's bounds (a NaN product becomes 0; i64 values
    /// beyond 2^53 lose precision); bool is unchanged unless factor is 0
    /// (then false). A factor of exactly 1 leaves `buf` untouched.
    fn scale(buf: &mut [Self], factor: f64);

    /// Lossy conversion from f64 (integers: toward zero, saturating; bool:
    /// `v != 0`), for references, tests and benchmarks.
    fn from_f64(v: f64) -> Self;

    /// Lossy conversion to f64 (bool: 0 or 1).
    fn to_f64(self) -> f64;
}

/// Applies `f` to every pair `(acc[i], src[i])`. Monomorphized per closure,
/// so each reduce operation gets its own branch-free, vectorizable loop.
#[inline(always)]
pub(crate) fn zip_apply<T: Copy>(acc: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    assert_eq!(
        acc.len(),
        src.len(),
        "reduce_into: accumulator and source lengths differ"
    );
    for (a, &s) in acc.iter_mut().zip(src) {
        *a = f(*a, s);
    }
}

/// `dst[i] = f(a[i], b[i])`, the three-operand [`zip_apply`].
#[inline(always)]
pub(crate) fn zip3_apply<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    assert!(
        dst.len() == a.len() && a.len() == b.len(),
        "reduce_pair: lengths differ"
    );
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(x, y);
    }
}

/// Elements per block in [`reduce_many_blocked`]: the destination block stays
/// in L1 while every source is folded into it.
const NATIVE_BLOCK: usize = 4096;

/// `reduce_many` for types whose `reduce_into` is exact in their own
/// precision: combine the first two sources, fold the others in, block by
/// block.
pub(crate) fn reduce_many_blocked<T: Element>(dst: &mut [T], srcs: &[&[T]], op: ReduceOp) {
    for src in srcs {
        assert_eq!(
            src.len(),
            dst.len(),
            "reduce_many: a source's length differs from the destination's"
        );
    }
    let Some((first, rest)) = srcs.split_first() else {
        dst.fill(T::identity(op));
        return;
    };
    for (block, d) in dst.chunks_mut(NATIVE_BLOCK).enumerate() {
        let start = block * NATIVE_BLOCK;
        let end = start + d.len();
        match rest.split_first() {
            Some((second, more)) => {
                T::reduce_pair(d, &first[start..end], &second[start..end], op);
                for src in more {
                    T::reduce_into(d, &src[start..end], op);
                }
            }
            None => d.copy_from_slice(&first[start..end]),
        }
    }
}
