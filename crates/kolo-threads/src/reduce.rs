//! Reducing the ranks' blocks into one, with the prescale applied to every
//! input (`out = op_r(prescale * in_r)`), through the element kernels.

use kolo_protocol::ReduceOp;
use kolo_transport::Element;

/// Elements per block when inputs are prescaled before reducing: the
/// scaled copies of all ranks stay in cache.
const SCALE_BLOCK: usize = 1024;

/// `dst = op(prescale * srcs[0], prescale * srcs[1], ...)`. Every source
/// has `dst.len()` elements. With a prescale other than 1 each source block
/// is copied into `scaled` and scaled there first (the sources are other
/// ranks' buffers and stay untouched).
pub(crate) fn reduce_scaled<T: Element>(
    dst: &mut [T],
    srcs: &[&[T]],
    op: ReduceOp,
    prescale: f64,
    scaled: &mut Vec<T>,
) {
    if prescale == 1.0 {
        T::reduce_many(dst, srcs, op);
        return;
    }
    if scaled.len() < srcs.len() * SCALE_BLOCK {
        scaled.resize(srcs.len() * SCALE_BLOCK, T::default());
    }
    for (block, out) in dst.chunks_mut(SCALE_BLOCK).enumerate() {
        let start = block * SCALE_BLOCK;
        let range = start..start + out.len();
        for (src, copy) in srcs.iter().zip(scaled.chunks_mut(SCALE_BLOCK)) {
            let copy = &mut copy[..out.len()];
            copy.copy_from_slice(&src[range.clone()]);
            T::scale(copy, prescale);
        }
        let views: Vec<&[T]> = scaled
            .chunks(SCALE_BLOCK)
            .take(srcs.len())
            .map(|copy| &copy[..out.len()])
            .collect();
        T::reduce_many(out, &views, op);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_a_scalar_reference(
            inputs in prop::collection::vec(prop::collection::vec(-1000i32..1000, 2500), 1..5),
            prescale in prop::sample::select(vec![1.0, 0.5, 2.0, -3.0]),
            op in prop::sample::select(ReduceOp::ALL.to_vec()),
        ) {
            let len = inputs[0].len();
            let srcs: Vec<&[i32]> = inputs.iter().map(Vec::as_slice).collect();
            let mut dst = vec![0i32; len];
            let mut scaled = Vec::new();
            reduce_scaled(&mut dst, &srcs, op, prescale, &mut scaled);
            for i in 0..len {
                let mut values = inputs.iter().map(|v| {
                    let mut x = [v[i]];
                    i32::scale(&mut x, prescale);
                    x[0]
                });
                let first = values.next().unwrap_or_default();
                let expected = values.fold(first, |acc, x| match op {
                    ReduceOp::Sum | ReduceOp::Average => acc.wrapping_add(x),
                    ReduceOp::Product => acc.wrapping_mul(x),
                    ReduceOp::Min => acc.min(x),
                    ReduceOp::Max => acc.max(x),
                });
                prop_assert_eq!(dst[i], expected, "element {}", i);
            }
        }
    }
}
