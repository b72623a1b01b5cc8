//! How a reduction of one dtype, operation and scale maps onto NCCL plus
//! kolo-nccl's scale kernel (hand-written PTX, see the crate docs): a
//! built-in operation or a `PreMulSum` whose scalar folds every factor in,
//! with the scale kernel before and / or after where NCCL cannot express
//! the scaling. Pure functions over data.
//!
//! | dtype               | sum / average                         | min / max / product |
//! |---------------------|---------------------------------------|---------------------|
//! | f32, f64, f16, bf16 | `ncclAvg` or one PreMulSum¹           | native, kernels²    |
//! | u8, i8, i32, i64    | native sum, kernels²                  | native, kernels²    |
//! | bool                | as u8: OR = max, AND = min; a zero factor clears the result | |
//! | u16, i16            | unsupported (no NCCL type)³           | unsupported³        |
//!
//! ¹ `postscale * sum(prescale * x)` is computed as `sum((prescale *
//! postscale / n) * x)` in one PreMulSum on two or more ranks (for f16 /
//! bf16 NCCL rounds the factor to the element type); on one rank as a copy
//! and one scale kernel, because NCCL's single-rank PreMulSum leaves all
//! but the first few thousand elements unscaled. ² The scale kernel
//! applies the prescale to every rank's input and the postscale (divided
//! by n for averages) to the result with kolo's [`Element::scale`]
//! semantics (integers in f64, rounded toward zero, saturating), so the
//! device agrees with the host backends bit for bit. ³ [`crate::HostStaging`]
//! covers these on host buffers.
//!
//! [`Element::scale`]: kolo_transport::Element::scale

use crate::error::NcclError;
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::Scale;

/// The NCCL element types kolo's dtypes reduce as (`ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclType {
    /// `ncclInt8`.
    Int8,
    /// `ncclUint8` (also bool).
    Uint8,
    /// `ncclInt32`.
    Int32,
    /// `ncclInt64`.
    Int64,
    /// `ncclFloat16`.
    Float16,
    /// `ncclBfloat16`.
    Bfloat16,
    /// `ncclFloat32`.
    Float32,
    /// `ncclFloat64`.
    Float64,
}

/// NCCL's built-in reductions (`ncclRedOp_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NativeOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`.
    Avg,
}

/// NCCL's type for reductions over `dtype`, if it has one (`bool` travels
/// as `u8`).
pub(crate) fn nccl_type(dtype: DataType) -> Option<NcclType> {
    Some(match dtype {
        DataType::U8 | DataType::Bool => NcclType::Uint8,
        DataType::I8 => NcclType::Int8,
        DataType::I32 => NcclType::Int32,
        DataType::I64 => NcclType::Int64,
        DataType::F16 => NcclType::Float16,
        DataType::BF16 => NcclType::Bfloat16,
        DataType::F32 => NcclType::Float32,
        DataType::F64 => NcclType::Float64,
        DataType::U16 | DataType::I16 => return None,
    })
}

/// The NCCL operation to run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceKind {
    /// A built-in operation.
    Native(NativeOp),
    /// `ncclRedOpCreatePreMulSum` with this factor: every input is
    /// multiplied by it, then summed.
    PreMulSum(f64),
}

/// A reduction as the device runs it: an optional scale kernel on every
/// rank's input, one NCCL operation, an optional scale kernel on the
/// result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReducePlan {
    /// kolo's element type (what the scale kernels work on).
    pub elem: DataType,
    /// NCCL's element type.
    pub dtype: NcclType,
    /// The NCCL operation.
    pub kind: ReduceKind,
    /// Scale kernel factor applied to the input before NCCL (`None`: none).
    pub prescale: Option<f64>,
    /// Scale kernel factor applied to the result after NCCL (`None`: none).
    pub postscale: Option<f64>,
}

/// Plans `op` with `scale` over `dtype` on `size` ranks, or says why the
/// device cannot do it.
pub fn plan_reduce(
    dtype: DataType,
    op: ReduceOp,
    scale: Scale,
    size: usize,
) -> Result<ReducePlan, NcclError> {
    let nccl = nccl_type(dtype).ok_or_else(|| NcclError::Unsupported {
        op: format!("allreduce({})", op.name()),
        dtype,
        reason: "NCCL has no 16-bit integer type; use HostStaging or a 32-bit type".into(),
    })?;
    let not_finite = |what: &str, factor: f64| {
        NcclError::InvalidArgument(format!(
            "allreduce({}) of {dtype}: the {what} {factor} is not finite",
            op.name()
        ))
    };
    for (what, factor) in [("prescale", scale.prescale), ("postscale", scale.postscale)] {
        if !factor.is_finite() {
            return Err(not_finite(what, factor));
        }
    }
    let plan = |kind, prescale, postscale| {
        Ok(ReducePlan {
            elem: dtype,
            dtype: nccl,
            kind,
            prescale,
            postscale,
        })
    };
    let kernel = |factor: f64| (factor != 1.0).then_some(factor);
    let post = scale.postscale_for(op, size);
    if dtype == DataType::Bool {
        // kolo's bool: sum = OR, product = AND, min = AND, max = OR; a
        // zero factor (before or after) leaves false everywhere, any other
        // leaves a bool unchanged.
        let native = match op {
            ReduceOp::Sum | ReduceOp::Average | ReduceOp::Max => NativeOp::Max,
            ReduceOp::Product | ReduceOp::Min => NativeOp::Min,
        };
        let cleared = scale.prescale == 0.0 || scale.postscale == 0.0;
        return plan(ReduceKind::Native(native), None, cleared.then_some(0.0));
    }
    let sum = ReduceKind::Native(NativeOp::Sum);
    match op {
        ReduceOp::Sum | ReduceOp::Average if dtype.is_float() => {
            let factor = scale.prescale * post;
            if factor == 1.0 {
                plan(sum, None, None)
            } else if op == ReduceOp::Average && scale.is_identity() && size > 1 {
                plan(ReduceKind::Native(NativeOp::Avg), None, None)
            } else if !factor.is_finite() {
                Err(not_finite("combined scale factor", factor))
            } else if size > 1 {
                plan(ReduceKind::PreMulSum(factor), None, None)
            } else {
                plan(sum, None, Some(factor))
            }
        }
        ReduceOp::Sum | ReduceOp::Average => plan(sum, kernel(scale.prescale), kernel(post)),
        ReduceOp::Min => plan(
            ReduceKind::Native(NativeOp::Min),
            kernel(scale.prescale),
            kernel(post),
        ),
        ReduceOp::Max => plan(
            ReduceKind::Native(NativeOp::Max),
            kernel(scale.prescale),
            kernel(post),
        ),
        ReduceOp::Product => plan(
            ReduceKind::Native(NativeOp::Prod),
            kernel(scale.prescale),
            kernel(post),
        ),
    }
}

/// The bytes of `factor` as one value of the float `dtype`, for a
/// host-immediate PreMulSum scalar (zero for integer types, which never
/// plan a PreMulSum).
pub(crate) fn scalar_bytes(dtype: NcclType, factor: f64) -> [u8; 8] {
    let mut out = [0u8; 8];
    match dtype {
        NcclType::Float64 => out.copy_from_slice(&factor.to_ne_bytes()),
        NcclType::Float32 => out[..4].copy_from_slice(&(factor as f32).to_ne_bytes()),
        NcclType::Float16 => {
            out[..2].copy_from_slice(&half::f16::from_f64(factor).to_bits().to_ne_bytes())
        }
        NcclType::Bfloat16 => {
            out[..2].copy_from_slice(&half::bf16::from_f64(factor).to_bits().to_ne_bytes())
        }
        NcclType::Int8 | NcclType::Uint8 | NcclType::Int32 | NcclType::Int64 => {}
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
                (ReduceOp::Sum, NativeOp::Sum),
                (ReduceOp::Min, NativeOp::Min),
                (ReduceOp::Max, NativeOp::Max),
                (ReduceOp::Product, NativeOp::Prod),
            ] {
                let p = plan(dtype, op, 1.0, 1.0, 4).unwrap();
                assert_eq!(p.kind, ReduceKind::Native(native));
                assert_eq!((p.prescale, p.postscale), (None, None));
                assert_eq!(p.elem, dtype);
            }
        }
        assert_eq!(
            plan(DataType::F16, ReduceOp::Average, 1.0, 1.0, 4)
                .unwrap()
                .kind,
            ReduceKind::Native(NativeOp::Avg)
        );
        // An average over one rank is a plain sum, for integers too.
        let p = plan(DataType::I32, ReduceOp::Average, 1.0, 1.0, 1).unwrap();
        assert_eq!(p.kind, ReduceKind::Native(NativeOp::Sum));
        assert_eq!(p.postscale, None);
    }

    #[test]
    fn float_scales_fold_into_one_premulsum_factor() {
        let p = plan(DataType::F32, ReduceOp::Average, 2.0, 3.0, 4).unwrap();
        assert_eq!(p.kind, ReduceKind::PreMulSum(1.5));
        assert_eq!(p.dtype, NcclType::Float32);
        assert_eq!((p.prescale, p.postscale), (None, None));
        let p = plan(DataType::F64, ReduceOp::Sum, 0.5, 1.0, 8).unwrap();
        assert_eq!(p.kind, ReduceKind::PreMulSum(0.5));
        // Factors that cancel need no PreMulSum.
        assert_eq!(
            plan(DataType::F32, ReduceOp::Sum, 4.0, 0.25, 2)
                .unwrap()
                .kind,
            ReduceKind::Native(NativeOp::Sum)
        );
    }

    #[test]
    fn one_rank_scales_with_the_kernel_not_premulsum() {
        let p = plan(DataType::F32, ReduceOp::Sum, 0.5, 3.0, 1).unwrap();
        assert_eq!(p.kind, ReduceKind::Native(NativeOp::Sum));
        assert_eq!((p.prescale, p.postscale), (None, Some(1.5)));
        let p = plan(DataType::BF16, ReduceOp::Average, 1.0, 2.0, 1).unwrap();
        assert_eq!((p.prescale, p.postscale), (None, Some(2.0)));
    }

    #[test]
    fn integer_and_non_sum_scales_use_the_kernel() {
        let p = plan(DataType::I32, ReduceOp::Average, 1.0, 1.0, 2).unwrap();
        assert_eq!(p.kind, ReduceKind::Native(NativeOp::Sum));
        assert_eq!((p.prescale, p.postscale), (None, Some(0.5)));
        let p = plan(DataType::I64, ReduceOp::Sum, 3.0, 0.5, 4).unwrap();
        assert_eq!((p.prescale, p.postscale), (Some(3.0), Some(0.5)));
        let p = plan(DataType::F32, ReduceOp::Max, 2.0, 1.0, 2).unwrap();
        assert_eq!(p.kind, ReduceKind::Native(NativeOp::Max));
        assert_eq!((p.prescale, p.postscale), (Some(2.0), None));
        // Min / max / product are not averages: the postscale is not divided.
        let p = plan(DataType::U8, ReduceOp::Product, 1.0, 0.5, 4).unwrap();
        assert_eq!((p.prescale, p.postscale), (None, Some(0.5)));
    }

    #[test]
    fn names_what_the_device_cannot_do() {
        let e = plan(DataType::I16, ReduceOp::Sum, 1.0, 1.0, 2).unwrap_err();
        assert!(e.to_string().contains("16-bit"), "{e}");
        assert!(matches!(
            e,
            NcclError::Unsupported {
                dtype: DataType::I16,
                ..
            }
        ));
        let e = plan(DataType::F32, ReduceOp::Sum, f64::INFINITY, 1.0, 2).unwrap_err();
        assert!(matches!(e, NcclError::InvalidArgument(_)), "{e}");
        let e = plan(DataType::I32, ReduceOp::Min, 1.0, f64::NAN, 2).unwrap_err();
        assert!(e.to_string().contains("postscale NaN"), "{e}");
        let e = plan(DataType::F64, ReduceOp::Sum, 1e300, 1e300, 2).unwrap_err();
        assert!(e.to_string().contains("combined scale factor"), "{e}");
    }

    #[test]
    fn bools_reduce_as_or_and_and() {
        assert_eq!(
            plan(DataType::Bool, ReduceOp::Sum, 1.0, 1.0, 3)
                .unwrap()
                .kind,
            ReduceKind::Native(NativeOp::Max)
        );
        assert_eq!(
            plan(DataType::Bool, ReduceOp::Average, 1.0, 1.0, 3)
                .unwrap()
                .kind,
            ReduceKind::Native(NativeOp::Max)
        );
        assert_eq!(
            plan(DataType::Bool, ReduceOp::Product, 1.0, 1.0, 3)
                .unwrap()
                .kind,
            ReduceKind::Native(NativeOp::Min)
        );
        let p = plan(DataType::Bool, ReduceOp::Min, 2.0, 5.0, 3).unwrap();
        assert_eq!(p.kind, ReduceKind::Native(NativeOp::Min));
        assert_eq!((p.prescale, p.postscale), (None, None));
        let p = plan(DataType::Bool, ReduceOp::Max, 0.0, 1.0, 3).unwrap();
        assert_eq!((p.prescale, p.postscale), (None, Some(0.0)));
    }

    #[test]
    fn scalar_bytes_hold_the_factor_in_the_element_type() {
        assert_eq!(scalar_bytes(NcclType::Float64, 0.25), 0.25f64.to_ne_bytes());
        assert_eq!(
            &scalar_bytes(NcclType::Float32, 0.25)[..4],
            &0.25f32.to_ne_bytes()
        );
        assert_eq!(
            &scalar_bytes(NcclType::Float16, 0.5)[..2],
            &half::f16::from_f32(0.5).to_bits().to_ne_bytes()
        );
        assert_eq!(
            &scalar_bytes(NcclType::Bfloat16, 2.0)[..2],
            &half::bf16::from_f32(2.0).to_bits().to_ne_bytes()
        );
    }

    proptest! {
        /// Every plan is a valid NCCL operation whose factors compose to
        /// kolo's `postscale_for(op) * op(prescale * x)`; only 16-bit
        /// integers are refused.
        #[test]
        fn every_plan_composes_to_kolos_scaling(
            dtype in proptest::sample::select(DataType::ALL.to_vec()),
            op in proptest::sample::select(ReduceOp::ALL.to_vec()),
            pre in prop_oneof![Just(1.0), Just(0.5), Just(2.0), Just(0.0)],
            post in prop_oneof![Just(1.0), Just(0.25)],
            size in 1usize..9,
        ) {
            let scale = Scale { prescale: pre, postscale: post };
            match plan(dtype, op, pre, post, size) {
                Ok(p) => {
                    prop_assert_eq!(Some(p.dtype), nccl_type(dtype));
                    prop_assert!(p.prescale != Some(1.0) && p.postscale != Some(1.0));
                    let (k_pre, k_post) = (p.prescale.unwrap_or(1.0), p.postscale.unwrap_or(1.0));
                    match p.kind {
                        ReduceKind::Native(_) => {}
                        ReduceKind::PreMulSum(f) => {
                            prop_assert!(dtype.is_float() && size > 1);
                            prop_assert_eq!(f, pre * scale.postscale_for(op, size));
                        }
                    }
                    if p.kind == ReduceKind::Native(NativeOp::Avg) {
                        prop_assert!(scale.is_identity() && op == ReduceOp::Average);
                    } else if dtype == DataType::Bool {
                        let cleared = pre == 0.0 || post == 0.0;
                        prop_assert_eq!(k_post, if cleared { 0.0 } else { 1.0 });
                    } else if dtype.is_float() && matches!(op, ReduceOp::Sum | ReduceOp::Average) {
                        let folded = match p.kind { ReduceKind::PreMulSum(f) => f, _ => 1.0 };
                        prop_assert_eq!(k_pre * folded * k_post, pre * scale.postscale_for(op, size));
                    } else {
                        prop_assert_eq!((k_pre, k_post), (pre, scale.postscale_for(op, size)));
                    }
                }
                Err(e) => {
                    prop_assert!(matches!(dtype, DataType::U16 | DataType::I16), "unexpected error {}", e);
                    let unsupported = matches!(e, NcclError::Unsupported { .. });
                    prop_assert!(unsupported);
                }
            }
        }
    }
}
