//! The `Element` implementations, one macro per family of types.

use super::widen::Widen;
use super::{reduce_many_blocked, zip3_apply, zip_apply, Element, HALF_BLOCK};
use half::{bf16, f16};
use kolo_protocol::{DataType, ReduceOp};

/// Integers: wrapping sum and product, natural min / max, scale in f64
/// rounded toward zero (Rust's saturating `as`).
macro_rules! int_element {
    ($($t:ty => $dtype:ident),* $(,)?) => {$(
        // SAFETY: a primitive integer is `Copy`, has no padding and every bit
        // pattern is a valid value.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;

            fn identity(op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Average => 0,
                    ReduceOp::Product => 1,
                    ReduceOp::Min => <$t>::MAX,
                    ReduceOp::Max => <$t>::MIN,
                }
            }

            fn reduce_into(acc: &mut [Self], src: &[Self], op: ReduceOp) {
                match op {
                    ReduceOp::Sum | ReduceOp::Average => zip_apply(acc, src, <$t>::wrapping_add),
                    ReduceOp::Product => zip_apply(acc, src, <$t>::wrapping_mul),
                    ReduceOp::Min => zip_apply(acc, src, <$t>::min),
                    ReduceOp::Max => zip_apply(acc, src, <$t>::max),
                }
            }

            fn reduce_pair(dst: &mut [Self], a: &[Self], b: &[Self], op: ReduceOp) {
                match op {
                    ReduceOp::Sum | ReduceOp::Average => zip3_apply(dst, a, b, <$t>::wrapping_add),
                    ReduceOp::Product => zip3_apply(dst, a, b, <$t>::wrapping_mul),
                    ReduceOp::Min => zip3_apply(dst, a, b, <$t>::min),
                    ReduceOp::Max => zip3_apply(dst, a, b, <$t>::max),
                }
            }

            fn reduce_many(dst: &mut [Self], srcs: &[&[Self]], op: ReduceOp) {
                reduce_many_blocked(dst, srcs, op);
            }

            fn scale(buf: &mut [Self], factor: f64) {
                if factor == 1.0 {
                    return;
                }
                for x in buf {
                    // `as` from f64 truncates toward zero and saturates.
                    *x = (*x as f64 * factor) as $t;
                }
            }

            fn from_f64(v: f64) -> Self {
                v as $t
            }

            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}

int_element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, i32 => I32, i64 => I64);

/// f32 and f64: IEEE arithmetic in the type's own precision.
macro_rules! float_element {
    ($($t:ident => $dtype:ident),* $(,)?) => {$(
        // SAFETY: a primitive float is `Copy`, has no padding and every bit
        // pattern is a valid value.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;

            fn identity(op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Average => 0.0,
                    ReduceOp::Product => 1.0,
                    ReduceOp::Min => $t::INFINITY,
                    ReduceOp::Max => $t::NEG_INFINITY,
                }
            }

            fn reduce_into(acc: &mut [Self], src: &[Self], op: ReduceOp) {
                match op {
                    ReduceOp::Sum | ReduceOp::Average => zip_apply(acc, src, |a, b| a + b),
                    ReduceOp::Product => zip_apply(acc, src, |a, b| a * b),
                    ReduceOp::Min => zip_apply(acc, src, $t::min),
                    ReduceOp::Max => zip_apply(acc, src, $t::max),
                }
            }

            fn reduce_pair(dst: &mut [Self], a: &[Self], b: &[Self], op: ReduceOp) {
                match op {
                    ReduceOp::Sum | ReduceOp::Average => zip3_apply(dst, a, b, |x, y| x + y),
                    ReduceOp::Product => zip3_apply(dst, a, b, |x, y| x * y),
                    ReduceOp::Min => zip3_apply(dst, a, b, $t::min),
                    ReduceOp::Max => zip3_apply(dst, a, b, $t::max),
                }
            }

            fn reduce_many(dst: &mut [Self], srcs: &[&[Self]], op: ReduceOp) {
                reduce_many_blocked(dst, srcs, op);
            }

            fn scale(buf: &mut [Self], factor: f64) {
                if factor == 1.0 {
                    return;
                }
                let factor = factor as $t;
                for x in buf {
                    *x *= factor;
                }
            }

            fn from_f64(v: f64) -> Self {
                v as $t
            }

            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}

float_element!(f32 => F32, f64 => F64);

/// f16 and bf16: every kernel converts blocks of [`HALF_BLOCK`] elements to
/// f32 on the stack, works there, and rounds back once.
macro_rules! half_element {
    ($($t:ident => $dtype:ident),* $(,)?) => {$(
        // SAFETY: `f16` / `bf16` are `repr(transparent)` over `u16`: `Copy`,
        // no padding, every bit pattern a valid value.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;

            fn identity(op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Average => $t::ZERO,
                    ReduceOp::Product => $t::ONE,
                    ReduceOp::Min => $t::INFINITY,
                    ReduceOp::Max => $t::NEG_INFINITY,
                }
            }

            fn reduce_into(acc: &mut [Self], src: &[Self], op: ReduceOp) {
                assert_eq!(
                    acc.len(),
                    src.len(),
                    "reduce_into: accumulator and source lengths differ"
                );
                let mut a = [0f32; HALF_BLOCK];
                let mut b = [0f32; HALF_BLOCK];
                for (acc, src) in acc.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
                    let (a, b) = (&mut a[..acc.len()], &mut b[..acc.len()]);
                    $t::widen(acc, a);
                    $t::widen(src, b);
                    f32::reduce_into(a, b, op);
                    $t::narrow(a, acc);
                }
            }

            fn reduce_many(dst: &mut [Self], srcs: &[&[Self]], op: ReduceOp) {
                for src in srcs {
                    assert_eq!(
                        src.len(),
                        dst.len(),
                        "reduce_many: a source's length differs from the destination's"
                    );
                }
                let Some((first, rest)) = srcs.split_first() else {
                    dst.fill(Self::identity(op));
                    return;
                };
                let mut acc = [0f32; HALF_BLOCK];
                let mut next = [0f32; HALF_BLOCK];
                for (block, dst) in dst.chunks_mut(HALF_BLOCK).enumerate() {
                    let range = block * HALF_BLOCK..block * HALF_BLOCK + dst.len();
                    let (acc, next) = (&mut acc[..dst.len()], &mut next[..dst.len()]);
                    $t::widen(&first[range.clone()], acc);
                    for src in rest {
                        $t::widen(&src[range.clone()], next);
                        f32::reduce_into(acc, next, op);
                    }
                    $t::narrow(acc, dst);
                }
            }

            fn scale(buf: &mut [Self], factor: f64) {
                if factor == 1.0 {
                    return;
                }
                let mut block = [0f32; HALF_BLOCK];
                for chunk in buf.chunks_mut(HALF_BLOCK) {
                    let block = &mut block[..chunk.len()];
                    $t::widen(chunk, block);
                    f32::scale(block, factor);
                    $t::narrow(block, chunk);
                }
            }

            fn from_f64(v: f64) -> Self {
                $t::from_f64(v)
            }

            fn to_f64(self) -> f64 {
                $t::to_f64(self)
            }
        }
    )*};
}

half_element!(f16 => F16, bf16 => BF16);

// SAFETY: `bool` is one byte with no padding. Not every byte is a valid
// `bool`, so kolo only writes bytes that came from `bool`s
// (`byte_view::copy_from_bytes` checks them).
unsafe impl Element for bool {
    const DTYPE: DataType = DataType::Bool;

    fn identity(op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Average | ReduceOp::Max => false,
            ReduceOp::Product | ReduceOp::Min => true,
        }
    }

    fn reduce_into(acc: &mut [Self], src: &[Self], op: ReduceOp) {
        match op {
            ReduceOp::Sum | ReduceOp::Average | ReduceOp::Max => zip_apply(acc, src, |a, b| a | b),
            ReduceOp::Product | ReduceOp::Min => zip_apply(acc, src, |a, b| a & b),
        }
    }

    fn reduce_many(dst: &mut [Self], srcs: &[&[Self]], op: ReduceOp) {
        reduce_many_blocked(dst, srcs, op);
    }

    fn scale(buf: &mut [Self], factor: f64) {
        if factor == 0.0 {
            buf.fill(false);
        }
    }

    fn from_f64(v: f64) -> Self {
        v != 0.0
    }

    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
}
