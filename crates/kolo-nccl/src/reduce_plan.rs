//! How a reduction of one dtype, operation and scale maps onto NCCL: a
//! built-in operation, or a `PreMulSum` whose scalar folds every factor in.
//! Pure functions over data; the device has no kernel of kolo's own (no
//! nvrtc), so what NCCL cannot express is [`NcclError::Unsupported`].
//!
//! | dtype               | sum / min / max / product | average, pre/post scale        |
//! |---------------------|---------------------------|--------------------------------|
//! | f32, f64, f16, bf16 | native                    | sum: `ncclAvg` or PreMulSum¹   |
//! | u8, i8, i32, i64    | native                    | unsupported (needs a kernel)²  |
//! | bool                | as u8: OR = max, AND = min | factors ignored unless zero   |
//! | u16, i16            | unsupported (no NCCL type)² | unsupported²                 |
//!
//! ¹ `postscale * sum(prescale * x)` is computed as `sum((prescale *
//! postscale / n) * x)` in one PreMulSum (for f16 / bf16 the factor is
//! rounded to the element type); min, max and product with a scale are
//! unsupported. ² [`crate::HostStaging`] covers these on host buffers.

use crate::error::NcclError;
use crate::sys;
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::Scale;

/// NCCL's type for reductions over `dtype`, if it has one (`bool` travels
/// as `u8`).
pub fn nccl_dtype(dtype: DataType) -> Option<sys::DataType> {
    Some(match dtype {
        DataType::U8 | DataType::Bool => sys::dtype::UINT8,
        DataType::I8 => sys::dtype::INT8,
        DataType::I32 => sys::dtype::INT32,
        DataType::I64 => sys::dtype::INT64,
        DataType::F16 => sys::dtype::FLOAT16,
        DataType::BF16 => sys::dtype::BFLOAT16,
        DataType::F32 => sys::dtype::FLOAT32,
        DataType::F64 => sys::dtype::FLOAT64,
        DataType::U16 | DataType::I16 => return None,
    })
}

/// The NCCL operation to run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceKind {
    /// A built-in `ncclRedOp_t`.
    Native(sys::RedOp),
    /// `ncclRedOpCreatePreMulSum` with this factor: every input is
    /// multiplied by it, then summed.
    PreMulSum(f64),
}

/// A reduction as NCCL will run it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReducePlan {
    /// NCCL's dtype.
    pub dtype: sys::DataType,
    /// The operation.
    pub kind: ReduceKind,
}

/// Plans `op` with `scale` over `dtype` on `size` ranks, or says why the
/// device cannot do it.
pub fn plan_reduce(
    dtype: DataType,
    op: ReduceOp,
    scale: Scale,
    size: usize,
) -> Result<ReducePlan, NcclError> {
    let unsupported = |reason: &str| NcclError::Unsupported {
        op: format!("allreduce({})", op.name()),
        dtype,
        reason: reason.to_string(),
    };
    let nccl = nccl_dtype(dtype).ok_or_else(|| {
        unsupported("NCCL has no 16-bit integer type; use HostStaging or a 32-bit type")
    })?;
    let factor = scale.prescale * scale.postscale_for(op, size);
    if dtype == DataType::Bool {
        // kolo's bool: sum = OR, product = AND, min = AND, max = OR; a
        // nonzero factor leaves a bool unchanged.
        if scale.prescale == 0.0 || scale.postscale == 0.0 {
            return Err(unsupported("a zero scale on bool needs a device kernel"));
        }
        let native = match op {
            ReduceOp::Sum | ReduceOp::Average | ReduceOp::Max => sys::op::MAX,
            ReduceOp::Product | ReduceOp::Min => sys::op::MIN,
        };
        return Ok(ReducePlan {
            dtype: nccl,
            kind: ReduceKind::Native(native),
        });
    }
    let native = |native| {
        Ok(ReducePlan {
            dtype: nccl,
            kind: ReduceKind::Native(native),
        })
    };
    match op {
        ReduceOp::Sum | ReduceOp::Average if factor == 1.0 => native(sys::op::SUM),
        ReduceOp::Average if dtype.is_float() && scale.is_identity() => native(sys::op::AVG),
        ReduceOp::Sum | ReduceOp::Average if dtype.is_float() => {
            if !factor.is_finite() {
                return Err(NcclError::InvalidArgument(format!(
                    "allreduce({}) of {dtype}: the scale factor {factor} is not finite",
                    op.name()
                )));
            }
            Ok(ReducePlan {
                dtype: nccl,
                kind: ReduceKind::PreMulSum(factor),
            })
        }
        ReduceOp::Sum | ReduceOp::Average => Err(unsupported(
            "integer averages and scales round in f64 and need a device kernel; use HostStaging or a float type",
        )),
        _ if !scale.is_identity() => Err(unsupported(
            "min, max and product with a pre/post scale need a device kernel; scale separately",
        )),
        ReduceOp::Min => native(sys::op::MIN),
        ReduceOp::Max => native(sys::op::MAX),
        ReduceOp::Product => native(sys::op::PROD),
    }
}

/// The bytes of `factor` as one value of the float `dtype`, for a
/// host-immediate PreMulSum scalar.
pub fn scalar_bytes(dtype: sys::DataType, factor: f64) -> [u8; 8] {
    let mut out = [0u8; 8];
    match dtype {
        sys::dtype::FLOAT64 => out.copy_from_slice(&factor.to_ne_bytes()),
        sys::dtype::FLOAT32 => out[..4].copy_from_slice(&(factor as f32).to_ne_bytes()),
        sys::dtype::FLOAT16 => {
            out[..2].copy_from_slice(&half::f16::from_f64(factor).to_bits().to_ne_bytes())
        }
        sys::dtype::BFLOAT16 => {
            out[..2].copy_from_slice(&half::bf16::from_f64(factor).to_bits().to_ne_bytes())
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plan(
        dtype: DataType,
        op: ReduceOp,
        pre: f64,
        post: f64,
        size: usize,
    ) -> Result<ReducePlan, NcclError> {
        plan_reduce(
            dtype,
            op,
            Scale {
                prescale: pre,
                postscale: post,
            },
            size,
        )
    }

    #[test]
    fn plain_operations_are_native() {
        for dtype in [DataType::F32, DataType::I64, DataType::U8, DataType::BF16] {
            for (op, native) in [
                (ReduceOp::Sum, sys::op::SUM),
                (ReduceOp::Min, sys::op::MIN),
                (ReduceOp::Max, sys::op::MAX),
                (ReduceOp::Product, sys::op::PROD),
            ] {
                assert_eq!(
                    plan(dtype, op, 1.0, 1.0, 4).unwrap().kind,
                    ReduceKind::Native(native)
                );
            }
        }
        assert_eq!(
            plan(DataType::F16, ReduceOp::Average, 1.0, 1.0, 4)
                .unwrap()
                .kind,
            ReduceKind::Native(sys::op::AVG)
        );
        // An average over one rank is a plain sum, for integers too.
        assert_eq!(
            plan(DataType::I32, ReduceOp::Average, 1.0, 1.0, 1)
                .unwrap()
                .kind,
            ReduceKind::Native(sys::op::SUM)
        );
    }

    #[test]
    fn scales_fold_into_one_premulsum_factor() {
        let p = plan(DataType::F32, ReduceOp::Average, 2.0, 3.0, 4).unwrap();
        assert_eq!(p.kind, ReduceKind::PreMulSum(1.5));
        assert_eq!(p.dtype, sys::dtype::FLOAT32);
        let p = plan(DataType::F64, ReduceOp::Sum, 0.5, 1.0, 8).unwrap();
        assert_eq!(p.kind, ReduceKind::PreMulSum(0.5));
        // Factors that cancel need no PreMulSum.
        assert_eq!(
            plan(DataType::F32, ReduceOp::Sum, 4.0, 0.25, 2)
                .unwrap()
                .kind,
            ReduceKind::Native(sys::op::SUM)
        );
    }

    #[test]
    fn names_what_the_device_cannot_do() {
        let e = plan(DataType::I32, ReduceOp::Average, 1.0, 1.0, 2).unwrap_err();
        assert!(e.to_string().contains("allreduce(average) on i32"), "{e}");
        let e = plan(DataType::F32, ReduceOp::Max, 2.0, 1.0, 2).unwrap_err();
        assert!(
            matches!(
                e,
                NcclError::Unsupported {
                    dtype: DataType::F32,
                    ..
                }
            ),
            "{e}"
        );
        let e = plan(DataType::I16, ReduceOp::Sum, 1.0, 1.0, 2).unwrap_err();
        assert!(e.to_string().contains("16-bit"), "{e}");
        let e = plan(DataType::F32, ReduceOp::Sum, f64::INFINITY, 1.0, 2).unwrap_err();
        assert!(matches!(e, NcclError::InvalidArgument(_)), "{e}");
    }

    #[test]
    fn bools_reduce_as_or_and_and() {
        assert_eq!(
            plan(DataType::Bool, ReduceOp::Sum, 1.0, 1.0, 3)
                .unwrap()
                .kind,
            ReduceKind::Native(sys::op::MAX)
        );
        assert_eq!(
            plan(DataType::Bool, ReduceOp::Average, 1.0, 1.0, 3)
                .unwrap()
                .kind,
            ReduceKind::Native(sys::op::MAX)
        );
        assert_eq!(
            plan(DataType::Bool, ReduceOp::Product, 1.0, 1.0, 3)
                .unwrap()
                .kind,
            ReduceKind::Native(sys::op::MIN)
        );
        assert_eq!(
            plan(DataType::Bool, ReduceOp::Min, 2.0, 5.0, 3)
                .unwrap()
                .kind,
            ReduceKind::Native(sys::op::MIN)
        );
        assert!(plan(DataType::Bool, ReduceOp::Max, 0.0, 1.0, 3).is_err());
    }

    #[test]
    fn scalar_bytes_hold_the_factor_in_the_element_type() {
        assert_eq!(
            scalar_bytes(sys::dtype::FLOAT64, 0.25),
            0.25f64.to_ne_bytes()
        );
        assert_eq!(
            &scalar_bytes(sys::dtype::FLOAT32, 0.25)[..4],
            &0.25f32.to_ne_bytes()
        );
        assert_eq!(
            &scalar_bytes(sys::dtype::FLOAT16, 0.5)[..2],
            &half::f16::from_f32(0.5).to_bits().to_ne_bytes()
        );
        assert_eq!(
            &scalar_bytes(sys::dtype::BFLOAT16, 2.0)[..2],
            &half::bf16::from_f32(2.0).to_bits().to_ne_bytes()
        );
    }

    proptest! {
        #[test]
        fn every_plan_is_a_valid_nccl_operation(
            dtype in proptest::sample::select(DataType::ALL.to_vec()),
            op in proptest::sample::select(ReduceOp::ALL.to_vec()),
            pre in prop_oneof![Just(1.0), Just(0.5), Just(2.0)],
            post in prop_oneof![Just(1.0), Just(0.25)],
            size in 1usize..9,
        ) {
            match plan(dtype, op, pre, post, size) {
                Ok(p) => {
                    prop_assert_eq!(Some(p.dtype), nccl_dtype(dtype));
                    match p.kind {
                        ReduceKind::Native(o) => prop_assert!((0..=4).contains(&o)),
                        ReduceKind::PreMulSum(f) => {
                            prop_assert!(dtype.is_float());
                            let expected = pre * Scale { prescale: pre, postscale: post }.postscale_for(op, size);
                            prop_assert_eq!(f, expected);
                        }
                    }
                }
                Err(e) => prop_assert!(
                    matches!(e, NcclError::Unsupported { .. }),
                    "unexpected error {}", e
                ),
            }
        }
    }
}
