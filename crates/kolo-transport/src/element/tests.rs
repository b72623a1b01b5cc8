//! The kernels against scalar references written independently of them.

use super::{Element, HALF_BLOCK};
use half::{bf16, f16};
use kolo_protocol::ReduceOp;
use proptest::prelude::*;

/// An independent scalar model of one type's reduction: accumulate in `Acc`
/// (f32 for the half types), then narrow once.
trait Reference: Element {
    type Acc: Copy;
    fn widen(self) -> Self::Acc;
    fn narrow(acc: Self::Acc) -> Self;
    fn op(a: Self::Acc, b: Self::Acc, op: ReduceOp) -> Self::Acc;
}

macro_rules! int_reference {
    ($($t:ty),*) => {$(
        impl Reference for $t {
            type Acc = $t;
            fn widen(self) -> $t { self }
            fn narrow(acc: $t) -> $t { acc }
            fn op(a: $t, b: $t, op: ReduceOp) -> $t {
                let (wa, wb) = (a as i128, b as i128);
                // Truncating the exact i128 result is wrapping arithmetic.
                match op {
                    ReduceOp::Sum | ReduceOp::Average => (wa + wb) as $t,
                    ReduceOp::Product => (wa * wb) as $t,
                    ReduceOp::Min => if wa <= wb { a } else { b },
                    ReduceOp::Max => if wa >= wb { a } else { b },
                }
            }
        }
    )*};
}
int_reference!(u8, i8, u16, i16, i32, i64);

fn float_op(a: f64, b: f64, op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Average => a + b,
        ReduceOp::Product => a * b,
        ReduceOp::Min if a.is_nan() => b,
        ReduceOp::Max if a.is_nan() => b,
        ReduceOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        ReduceOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
    }
}

impl Reference for f64 {
    type Acc = f64;
    fn widen(self) -> f64 {
        self
    }
    fn narrow(acc: f64) -> f64 {
        acc
    }
    fn op(a: f64, b: f64, op: ReduceOp) -> f64 {
        float_op(a, b, op)
    }
}

impl Reference for f32 {
    type Acc = f32;
    fn widen(self) -> f32 {
        self
    }
    fn narrow(acc: f32) -> f32 {
        acc
    }
    // f64 holds the exact sum / product of two f32s; one rounding follows.
    fn op(a: f32, b: f32, op: ReduceOp) -> f32 {
        float_op(a as f64, b as f64, op) as f32
    }
}

macro_rules! half_reference {
    ($($t:ident),*) => {$(
        impl Reference for $t {
            type Acc = f32;
            fn widen(self) -> f32 { self.to_f32() }
            fn narrow(acc: f32) -> $t { $t::from_f32(acc) }
            fn op(a: f32, b: f32, op: ReduceOp) -> f32 { <f32 as Reference>::op(a, b, op) }
        }
    )*};
}
half_reference!(f16, bf16);

impl Reference for bool {
    type Acc = bool;
    fn widen(self) -> bool {
        self
    }
    fn narrow(acc: bool) -> bool {
        acc
    }
    fn op(a: bool, b: bool, op: ReduceOp) -> bool {
        match op {
            ReduceOp::Sum | ReduceOp::Average | ReduceOp::Max => a || b,
            ReduceOp::Product | ReduceOp::Min => a && b,
        }
    }
}

/// Equal, or both NaN.
fn same<T: Element>(a: T, b: T) -> bool {
    a == b || (a.to_f64().is_nan() && b.to_f64().is_nan())
}

fn assert_same<T: Element>(got: &[T], want: &[T]) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert!(same(*g, *w), "index {}: got {:?}, want {:?}", i, g, w);
    }
    Ok(())
}

fn check_reduce_into<T: Reference>(
    acc: &[T],
    src: &[T],
    op: ReduceOp,
) -> Result<(), TestCaseError> {
    let mut got = acc.to_vec();
    T::reduce_into(&mut got, src, op);
    let want: Vec<T> = acc
        .iter()
        .zip(src)
        .map(|(a, s)| T::narrow(T::op(a.widen(), s.widen(), op)))
        .collect();
    assert_same(&got, &want)
}

fn check_reduce_many<T: Reference>(
    srcs: &[Vec<T>],
    len: usize,
    op: ReduceOp,
) -> Result<(), TestCaseError> {
    let views: Vec<&[T]> = srcs.iter().map(|s| &s[..len]).collect();
    let mut got = vec![T::default(); len];
    T::reduce_many(&mut got, &views, op);
    let want: Vec<T> = (0..len)
        .map(|i| match views.split_first() {
            None => T::identity(op),
            Some((first, rest)) => T::narrow(
                rest.iter()
                    .fold(first[i].widen(), |acc, s| T::op(acc, s[i].widen(), op)),
            ),
        })
        .collect();
    assert_same(&got, &want)
}

fn check_identity<T: Reference>(values: &[T], op: ReduceOp) -> Result<(), TestCaseError> {
    let mut acc = vec![T::identity(op); values.len()];
    T::reduce_into(&mut acc, values, op);
    assert_same(&acc, values)
}

fn any_op() -> impl Strategy<Value = ReduceOp> {
    prop::sample::select(ReduceOp::ALL.to_vec())
}

macro_rules! kernel_props {
    ($($name:ident: $t:ty = $values:expr;)*) => {$(
        mod $name {
            use super::*;

            proptest! {
                #[test]
                fn reduce_into_matches_scalar(
                    pairs in prop::collection::vec(($values, $values), 0..(2 * HALF_BLOCK + 7)),
                    op in any_op(),
                ) {
                    let (acc, src): (Vec<$t>, Vec<$t>) = pairs.into_iter().unzip();
                    check_reduce_into(&acc, &src, op)?;
                }

                #[test]
                fn reduce_many_matches_scalar(
                    srcs in prop::collection::vec(
                        prop::collection::vec($values, 2 * HALF_BLOCK + 7), 0..5),
                    len in 0usize..(2 * HALF_BLOCK + 7),
                    op in any_op(),
                ) {
                    check_reduce_many::<$t>(&srcs, len, op)?;
                }

                #[test]
                fn identity_is_neutral(
                    values in prop::collection::vec($values, 0..40),
                    op in any_op(),
                ) {
                    // NaN is absorbed by nothing; the identity law holds for numbers.
                    let values: Vec<$t> = values.into_iter().filter(|v| !v.to_f64().is_nan()).collect();
                    check_identity(&values, op)?;
                }
            }
        }
    )*};
}

kernel_props! {
    u8_kernels: u8 = any::<u8>();
    i8_kernels: i8 = any::<i8>();
    u16_kernels: u16 = any::<u16>();
    i16_kernels: i16 = any::<i16>();
    i32_kernels: i32 = any::<i32>();
    i64_kernels: i64 = any::<i64>();
    f16_kernels: f16 = any::<u16>().prop_map(f16::from_bits);
    bf16_kernels: bf16 = any::<u16>().prop_map(bf16::from_bits);
    f32_kernels: f32 = any::<f32>();
    f64_kernels: f64 = any::<f64>();
    bool_kernels: bool = any::<bool>();
}

#[test]
fn integer_scale_rounds_toward_zero_and_saturates() {
    let mut v = [7i32, -7, 1, -1];
    i32::scale(&mut v, 0.5);
    assert_eq!(v, [3, -3, 0, 0]);
    let mut v = [200u8, 3];
    u8::scale(&mut v, 2.0);
    assert_eq!(v, [255, 6]);
    let mut v = [-100i8, 100];
    i8::scale(&mut v, 2.0);
    assert_eq!(v, [-128, 127]);
    let mut v = [5u16];
    u16::scale(&mut v, -1.0);
    assert_eq!(v, [0]);
    let mut v = [5i64];
    i64::scale(&mut v, f64::NAN);
    assert_eq!(v, [0]);
}

#[test]
fn integer_average_is_sum_then_scale_toward_zero() {
    let mut acc = [1i16, -1, 5];
    i16::reduce_into(&mut acc, &[2, -2, 5], ReduceOp::Average);
    i16::scale(&mut acc, 1.0 / 2.0);
    assert_eq!(acc, [1, -1, 5]);
}

#[test]
fn integer_sum_and_product_wrap() {
    let mut acc = [250u8, 16];
    u8::reduce_into(&mut acc, &[10, 16], ReduceOp::Sum);
    assert_eq!(acc, [4, 32]);
    let mut acc = [250u8, 16];
    u8::reduce_into(&mut acc, &[10, 16], ReduceOp::Product);
    assert_eq!(acc, [(2500 % 256) as u8, 0]);
}

#[test]
fn bool_ops_are_or_and() {
    let (a, b) = ([true, true, false, false], [true, false, true, false]);
    for (op, want) in [
        (ReduceOp::Sum, [true, true, true, false]),
        (ReduceOp::Average, [true, true, true, false]),
        (ReduceOp::Max, [true, true, true, false]),
        (ReduceOp::Product, [true, false, false, false]),
        (ReduceOp::Min, [true, false, false, false]),
    ] {
        let mut acc = a;
        bool::reduce_into(&mut acc, &b, op);
        assert_eq!(acc, want, "{op:?}");
    }
    let mut v = [true, false];
    bool::scale(&mut v, 0.5);
    assert_eq!(v, [true, false]);
    bool::scale(&mut v, 0.0);
    assert_eq!(v, [false, false]);
}

#[test]
fn float_scale_multiplies_in_own_precision() {
    let mut v = [1.0f32, -3.0, 0.1];
    f32::scale(&mut v, 0.5);
    assert_eq!(v, [0.5, -1.5, 0.1f32 * 0.5]);
    let mut v = vec![f16::from_f32(3.0); HALF_BLOCK + 3];
    f16::scale(&mut v, 0.25);
    assert!(v.iter().all(|x| *x == f16::from_f32(0.75)));
    let mut v = [bf16::from_f32(-2.0)];
    bf16::scale(&mut v, 3.0);
    assert_eq!(v, [bf16::from_f32(-6.0)]);
}

#[test]
fn half_reduce_many_accumulates_in_f32() {
    // In f16, 2048 + 1 rounds back to 2048 (spacing 2): pairwise reduction
    // would lose both ones; accumulating in f32 keeps them.
    let big = vec![f16::from_f32(2048.0); 3];
    let one = vec![f16::ONE; 3];
    let mut dst = vec![f16::ZERO; 3];
    f16::reduce_many(&mut dst, &[&big, &one, &one], ReduceOp::Sum);
    assert_eq!(dst, vec![f16::from_f32(2050.0); 3]);

    let mut pairwise = big.clone();
    f16::reduce_into(&mut pairwise, &one, ReduceOp::Sum);
    f16::reduce_into(&mut pairwise, &one, ReduceOp::Sum);
    assert_eq!(pairwise, big);

    let big = vec![bf16::from_f32(256.0); 2];
    let one = vec![bf16::ONE; 2];
    let mut dst = vec![bf16::ZERO; 2];
    bf16::reduce_many(&mut dst, &[&big, &one, &one], ReduceOp::Sum);
    assert_eq!(dst, vec![bf16::from_f32(258.0); 2]);
}

#[test]
fn conversions_round_trip_small_integers() {
    fn round_trip<T: Element>() {
        for v in [0.0, 1.0, 2.0, 7.0] {
            assert_eq!(
                T::from_f64(v).to_f64(),
                if T::DTYPE.name() == "bool" {
                    v.min(1.0)
                } else {
                    v
                }
            );
        }
    }
    round_trip::<u8>();
    round_trip::<i8>();
    round_trip::<u16>();
    round_trip::<i16>();
    round_trip::<i32>();
    round_trip::<i64>();
    round_trip::<f16>();
    round_trip::<bf16>();
    round_trip::<f32>();
    round_trip::<f64>();
    round_trip::<bool>();
    assert_eq!(u8::from_f64(-3.7), 0);
    assert_eq!(i8::from_f64(-3.7), -3);
    assert_eq!(i16::from_f64(1e9), i16::MAX);
}
