//! CONTRACT (to be implemented by the transport work): the element kernels.
//!
//! `Element` is implemented for u8, i8, u16, i16, i32, i64, half::f16,
//! half::bf16, f32, f64 and bool.

use kolo_protocol::{DataType, ReduceOp};

/// A tensor element kolo can move and reduce.
///
/// # Safety
/// Implementors are plain data: `Copy`, no padding, no pointers, so a
/// backend may move them as bytes. (`bool` is included: kolo only ever
/// writes bytes that were valid `bool`s.)
pub unsafe trait Element: Copy + Send + Sync + PartialEq + std::fmt::Debug + Default + 'static {
    /// The protocol's name for this type.
    const DTYPE: DataType;

    /// `acc[i] = op(acc[i], src[i])` for every i. `Average` reduces as `Sum`
    /// (the division is a scale applied afterwards). Must vectorize for the
    /// native numeric types. Panics only if the lengths differ (a kolo bug,
    /// never user input: callers check lengths first).
    fn reduce_into(acc: &mut [Self], src: &[Self], op: ReduceOp);

    /// `dst[i] = op(srcs[0][i], srcs[1][i], ...)`, all slices the same length
    /// as `dst`, `srcs` non-empty. f16 / bf16 accumulate in f32 and round
    /// once. `Average` reduces as `Sum`.
    fn reduce_many(dst: &mut [Self], srcs: &[&[Self]], op: ReduceOp);

    /// `buf[i] *= factor`. Floats multiply in their own precision (f16/bf16
    /// through f32); integers multiply in f64 and round toward zero,
    /// saturating at the type's bounds; bool is unchanged unless factor is
    /// 0 (then false).
    fn scale(buf: &mut [Self], factor: f64);

    /// Lossy conversions for references, tests and benchmarks.
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}
