//! Copies between tensors and a fused buffer in any memory: the layout is
//! checked here, so that a wrong one is an error naming the tensor; the
//! copies are the backend's ([`Collectives::pack_into`] and
//! [`Collectives::unpack_from`]: on the host
//! [`kolo_transport::copies`], parallel when large).

use crate::error::FusionError;
use kolo_transport::{copies, Collectives, Element, Memory};

pub use kolo_transport::copies::PARALLEL_COPY_BYTES;

/// Fails unless tensors of `lens`, laid out one after another from the
/// start, fill a fused buffer of `buffer` elements exactly.
fn check_layout(
    op: &'static str,
    lens: impl ExactSizeIterator<Item = usize>,
    buffer: usize,
) -> Result<(), FusionError> {
    let tensors = lens.len();
    let mut start = 0usize;
    for (tensor, len) in lens.enumerate() {
        match start.checked_add(len) {
            Some(end) if end <= buffer => start = end,
            _ => {
                return Err(FusionError::SegmentPastEnd {
                    op,
                    tensor,
                    start,
                    len,
                    buffer,
                })
            }
        }
    }
    if start == buffer {
        Ok(())
    } else {
        Err(FusionError::FusedLength {
            op,
            tensors,
            total: start,
            buffer,
        })
    }
}

/// Copies `srcs` one after another into `dst`, which must hold exactly
/// their total length, with the backend's copies (on memory `M`).
pub fn pack_into<M: Memory, C: Collectives<M>, T: Element>(
    comm: &mut C,
    srcs: &[M::Ref<'_, T>],
    dst: M::Mut<'_, T>,
) -> Result<(), FusionError> {
    check_layout(
        "pack",
        srcs.iter().map(|src| M::len(*src)),
        M::len_mut(&dst),
    )?;
    Ok(comm.pack_into(srcs, dst)?)
}

/// Copies consecutive pieces of `src` into `dsts`; `src` must hold exactly
/// their total length. The backend's copies, on memory `M`.
pub fn unpack_from<M: Memory, C: Collectives<M>, T: Element>(
    comm: &mut C,
    src: M::Ref<'_, T>,
    dsts: &mut [M::Mut<'_, T>],
) -> Result<(), FusionError> {
    check_layout("unpack", dsts.iter().map(M::len_mut), M::len(src))?;
    Ok(comm.unpack_from(src, dsts)?)
}

/// [`pack_into`] on the host without a backend: copies `srcs` one after
/// another into `dst` (parallel for large inputs).
pub fn pack<T: Element>(dst: &mut [T], srcs: &[&[T]]) -> Result<(), FusionError> {
    check_layout("pack", srcs.iter().map(|src| src.len()), dst.len())?;
    Ok(copies::pack(dst, srcs)?)
}

/// [`unpack_from`] on the host without a backend: copies consecutive
/// pieces of `src` into `dsts` (parallel for large outputs).
pub fn unpack<T: Element>(src: &[T], dsts: &mut [&mut [T]]) -> Result<(), FusionError> {
    check_layout("unpack", dsts.iter().map(|dst| dst.len()), src.len())?;
    Ok(copies::unpack(src, dsts)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Loopback;
    use kolo_transport::Host;
    use proptest::prelude::*;

    #[test]
    fn a_tensor_past_the_end_and_a_buffer_left_unfilled_are_errors_naming_them() {
        let mut dst = [0i32; 3];
        let err = pack(&mut dst, &[&[1, 2], &[3, 4]]).unwrap_err();
        assert_eq!(
            err,
            FusionError::SegmentPastEnd {
                op: "pack",
                tensor: 1,
                start: 2,
                len: 2,
                buffer: 3
            }
        );
        assert_eq!(
            err.to_string(),
            "pack: tensor 1 (elements 2..4) runs past the end of the fused buffer of 3 elements"
        );
        let mut a = [0i32; 1];
        let err = unpack(&[1, 2], &mut [&mut a[..]]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unpack: the 1 tensors hold 1 elements in all, but the fused buffer holds 2"
        );
        assert_eq!(dst, [0; 3], "nothing was copied");
    }

    #[test]
    fn large_copies_go_parallel_and_stay_exact() {
        // 3 MiB of f32 in uneven tensors, above the parallel threshold.
        let lens = [1, 700_000, 3, 86_000];
        let srcs: Vec<Vec<f32>> = lens
            .iter()
            .enumerate()
            .map(|(t, &n)| (0..n).map(|i| (t * 1_000_000 + i) as f32).collect())
            .collect();
        let src_refs: Vec<&[f32]> = srcs.iter().map(Vec::as_slice).collect();
        let mut fused = vec![0.0f32; lens.iter().sum()];
        pack(&mut fused, &src_refs).unwrap();
        assert_eq!(fused, srcs.concat());
        let mut outs: Vec<Vec<f32>> = lens.iter().map(|&n| vec![-1.0; n]).collect();
        let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        unpack(&fused, &mut out_refs).unwrap();
        assert_eq!(outs, srcs);
    }

    proptest! {
        #[test]
        fn unpack_inverts_pack(tensors in prop::collection::vec(prop::collection::vec(any::<i64>(), 0..40), 0..8)) {
            let refs: Vec<&[i64]> = tensors.iter().map(Vec::as_slice).collect();
            let mut fused = vec![0i64; tensors.iter().map(Vec::len).sum()];
            pack(&mut fused, &refs).unwrap();
            prop_assert_eq!(&fused, &tensors.concat());
            let mut outs: Vec<Vec<i64>> = tensors.iter().map(|t| vec![0; t.len()]).collect();
            let mut out_refs: Vec<&mut [i64]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
            unpack(&fused, &mut out_refs).unwrap();
            prop_assert_eq!(outs, tensors);
        }

        /// Through a backend: every tensor lands at the sum of the lengths
        /// before it, and a buffer one element off either way is refused
        /// naming the tensor that crosses its end or the shortfall.
        #[test]
        fn generic_pack_places_each_tensor_after_the_ones_before(
            lens in prop::collection::vec(0usize..50, 0..10),
            off_by in prop_oneof![Just(-1i64), Just(0), Just(1)],
        ) {
            let mut comm = Loopback::default();
            let tensors: Vec<Vec<i32>> = lens
                .iter()
                .enumerate()
                .map(|(t, &n)| (0..n as i32).map(|i| ((t as i32) << 16) | i).collect())
                .collect();
            let srcs: Vec<&[i32]> = tensors.iter().map(Vec::as_slice).collect();
            let total: usize = lens.iter().sum();
            let Some(len) = total.checked_add_signed(off_by as isize) else {
                return Ok(());
            };
            let mut fused = vec![i32::MIN; len];
            let packed = pack_into::<Host, _, _>(&mut comm, &srcs, &mut fused);
            let mut outs: Vec<Vec<i32>> = lens.iter().map(|&n| vec![0; n]).collect();
            let mut dsts: Vec<&mut [i32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
            let unpacked = unpack_from::<Host, _, _>(&mut comm, &fused, &mut dsts);
            if off_by == 0 {
                prop_assert_eq!(packed, Ok(()));
                prop_assert_eq!(unpacked, Ok(()));
                let mut start = 0;
                for (t, tensor) in tensors.iter().enumerate() {
                    prop_assert_eq!(&fused[start..start + tensor.len()], &tensor[..], "tensor {}", t);
                    start += tensor.len();
                }
                prop_assert_eq!(outs, tensors);
            } else if off_by < 0 {
                // The last non-empty tensor crosses the end.
                let tensor = lens.iter().rposition(|&n| n > 0).unwrap_or(0);
                let start: usize = lens[..tensor].iter().sum();
                let past = |op| FusionError::SegmentPastEnd { op, tensor, start, len: lens[tensor], buffer: len };
                prop_assert_eq!(packed, Err(past("pack")));
                prop_assert_eq!(unpacked, Err(past("unpack")));
                prop_assert!(fused.iter().all(|&v| v == i32::MIN), "nothing copied");
            } else {
                let short = |op| FusionError::FusedLength { op, tensors: lens.len(), total, buffer: len };
                prop_assert_eq!(packed, Err(short("pack")));
                prop_assert_eq!(unpacked, Err(short("unpack")));
                prop_assert!(outs.iter().flatten().all(|&v| v == 0), "nothing copied");
            }
        }
    }
}
