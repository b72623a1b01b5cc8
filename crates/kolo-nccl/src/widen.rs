//! How [`crate::HostStaging`] reduces the dtypes NCCL cannot reduce the
//! way kolo does: 16-bit integers travel as i32 (wrapping sums and products
//! truncate back exactly, since arithmetic mod 2^32 agrees with mod 2^16),
//! and f16 / bf16 as f32 (kolo accumulates them in f32 and rounds once).
//! Pure conversions over host slices.

use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{byte_view, Element, TransportError};

/// The type a reduction of `dtype` runs in on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// The element type itself.
    Native,
    /// i32, truncated back.
    I32,
    /// f32, rounded back once.
    F32,
}

/// The carrier of `dtype`.
pub fn carrier(dtype: DataType) -> Carrier {
    match dtype {
        DataType::U16 | DataType::I16 => Carrier::I32,
        DataType::F16 | DataType::BF16 => Carrier::F32,
        _ => Carrier::Native,
    }
}

/// The device operation for `op` when scaling happens on the host:
/// averages reduce as sums.
pub fn device_op(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Average => ReduceOp::Sum,
        other => other,
    }
}

/// `buf` (u16 or i16) as i32 values.
pub fn to_i32<T: Element>(buf: &[T]) -> Vec<i32> {
    let bytes = byte_view::as_bytes(buf);
    let pairs = bytes.chunks_exact(2).map(|c| [c[0], c[1]]);
    match T::DTYPE {
        DataType::I16 => pairs.map(|b| i32::from(i16::from_ne_bytes(b))).collect(),
        _ => pairs.map(|b| i32::from(u16::from_ne_bytes(b))).collect(),
    }
}

/// Writes `vals` back into `out` (u16 or i16), keeping the low 16 bits.
pub fn from_i32<T: Element>(vals: &[i32], out: &mut [T]) -> Result<(), TransportError> {
    // Truncating `as` keeps the value mod 2^16, as wrapping arithmetic would.
    let bytes: Vec<u8> = vals
        .iter()
        .flat_map(|&v| (v as u16).to_ne_bytes())
        .collect();
    byte_view::copy_from_bytes(out, &bytes)
}

/// `buf` (f16 or bf16) as f32 values (exact).
pub fn to_f32<T: Element>(buf: &[T]) -> Vec<f32> {
    buf.iter().map(|&x| x.to_f64() as f32).collect()
}

/// Writes `vals` back into `out` (f16 or bf16), rounding once.
pub fn from_f32<T: Element>(vals: &[f32], out: &mut [T]) {
    for (o, &v) in out.iter_mut().zip(vals) {
        *o = T::from_f64(f64::from(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use proptest::prelude::*;

    #[test]
    fn carriers() {
        assert_eq!(carrier(DataType::I16), Carrier::I32);
        assert_eq!(carrier(DataType::BF16), Carrier::F32);
        assert_eq!(carrier(DataType::I64), Carrier::Native);
        assert_eq!(carrier(DataType::Bool), Carrier::Native);
        assert_eq!(device_op(ReduceOp::Average), ReduceOp::Sum);
        assert_eq!(device_op(ReduceOp::Min), ReduceOp::Min);
    }

    #[test]
    fn halves_round_once_through_f32() {
        let h = [f16::from_f32(1.5), f16::from_f32(-0.25)];
        assert_eq!(to_f32(&h), vec![1.5, -0.25]);
        let mut out = [bf16::ZERO; 2];
        from_f32(&[1.0 + 1.0 / 256.0, 3.0], &mut out);
        assert_eq!(
            out,
            [bf16::from_f32(1.0 + 1.0 / 256.0), bf16::from_f32(3.0)]
        );
    }

    proptest! {
        /// Reducing 16-bit integers in i32 and truncating gives kolo's
        /// wrapping results for every operation.
        #[test]
        fn sixteen_bit_reductions_match_kolo(a in proptest::collection::vec(any::<i16>(), 1..40), b_seed in any::<u64>()) {
            let b: Vec<i16> = a.iter().enumerate().map(|(i, x)| x.wrapping_mul(7).wrapping_add((b_seed >> (i % 48)) as i16)).collect();
            for op in ReduceOp::ALL {
                let (wa, wb) = (to_i32(&a), to_i32(&b));
                let wide: Vec<i32> = wa.iter().zip(&wb).map(|(&x, &y)| match device_op(op) {
                    ReduceOp::Sum => x.wrapping_add(y),
                    ReduceOp::Product => x.wrapping_mul(y),
                    ReduceOp::Min => x.min(y),
                    _ => x.max(y),
                }).collect();
                let mut got = vec![0i16; a.len()];
                from_i32(&wide, &mut got).unwrap();
                let mut want = a.clone();
                i16::reduce_into(&mut want, &b, op);
                prop_assert_eq!(got, want);
            }
            let ua: Vec<u16> = a.iter().map(|&x| x as u16).collect();
            let ub: Vec<u16> = b.iter().map(|&x| x as u16).collect();
            let wide: Vec<i32> = to_i32(&ua).iter().zip(to_i32(&ub)).map(|(&x, y)| x.max(y)).collect();
            let mut got = vec![0u16; ua.len()];
            from_i32(&wide, &mut got).unwrap();
            let mut want = ua.clone();
            u16::reduce_into(&mut want, &ub, ReduceOp::Max);
            prop_assert_eq!(got, want);
        }
    }
}
