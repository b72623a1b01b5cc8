//! Copies between tensors and a fused buffer, parallel when large.

use crate::error::FusionError;
use kolo_transport::Element;
use rayon::prelude::*;

/// Above this many bytes in all, copies run on the rayon pool.
pub const PARALLEL_COPY_BYTES: usize = 1 << 20;

/// Large tensors are copied in pieces of at most this many bytes, so that
/// one big tensor spreads over the pool too.
const CHUNK_BYTES: usize = 256 << 10;

/// Copies every `(dst, src)` pair (same lengths, checked by the callers):
/// sequentially when small, else on the rayon pool, split per pair and big
/// pairs in chunks.
pub(crate) fn copy_pieces<T: Element>(pieces: Vec<(&mut [T], &[T])>) {
    let elem = std::mem::size_of::<T>().max(1);
    let total_bytes: usize = pieces.iter().map(|(dst, _)| dst.len() * elem).sum();
    if total_bytes <= PARALLEL_COPY_BYTES {
        for (dst, src) in pieces {
            dst.copy_from_slice(src);
        }
        return;
    }
    let chunk = (CHUNK_BYTES / elem).max(1);
    let chunks: Vec<(&mut [T], &[T])> = pieces
        .into_iter()
        .flat_map(|(dst, src)| dst.chunks_mut(chunk).zip(src.chunks(chunk)))
        .collect();
    chunks
        .into_par_iter()
        .for_each(|(dst, src)| dst.copy_from_slice(src));
}

/// Copies `srcs` one after another into `dst`, which must hold exactly their
/// total length (parallel for large inputs).
pub fn pack<T: Element>(dst: &mut [T], srcs: &[&[T]]) -> Result<(), FusionError> {
    let total: usize = srcs.iter().map(|s| s.len()).sum();
    if total != dst.len() {
        return Err(FusionError::FusedLength {
            op: "pack",
            tensors: srcs.len(),
            total,
            buffer: dst.len(),
        });
    }
    let mut pieces = Vec::with_capacity(srcs.len());
    let mut rest = dst;
    for src in srcs {
        let (piece, tail) = std::mem::take(&mut rest).split_at_mut(src.len());
        pieces.push((piece, *src));
        rest = tail;
    }
    copy_pieces(pieces);
    Ok(())
}

/// Copies consecutive pieces of `src` into `dsts`; `src` must hold exactly
/// their total length (parallel for large outputs).
pub fn unpack<T: Element>(src: &[T], dsts: &mut [&mut [T]]) -> Result<(), FusionError> {
    let total: usize = dsts.iter().map(|d| d.len()).sum();
    if total != src.len() {
        return Err(FusionError::FusedLength {
            op: "unpack",
            tensors: dsts.len(),
            total,
            buffer: src.len(),
        });
    }
    let mut pieces = Vec::with_capacity(dsts.len());
    let mut rest = src;
    for dst in dsts.iter_mut() {
        let (piece, tail) = rest.split_at(dst.len());
        pieces.push((&mut **dst, piece));
        rest = tail;
    }
    copy_pieces(pieces);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn length_mismatch_is_an_error() {
        let mut dst = [0i32; 3];
        let err = pack(&mut dst, &[&[1, 2], &[3, 4]]).unwrap_err();
        assert_eq!(
            err,
            FusionError::FusedLength {
                op: "pack",
                tensors: 2,
                total: 4,
                buffer: 3
            }
        );
        let mut a = [0i32; 1];
        let err = unpack(&[1, 2], &mut [&mut a[..]]).unwrap_err();
        assert!(err
            .to_string()
            .contains("hold 1 elements in all, but the fused buffer holds 2"));
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
    }
}
