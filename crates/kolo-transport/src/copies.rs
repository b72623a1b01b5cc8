//! Copies between tensors and one fused buffer in host memory, on the
//! rayon pool when large: what [`Host`](crate::Host) packs and unpacks
//! with for kolo-fusion.

use crate::element::Element;
use crate::error::{Result, TransportError};
use rayon::prelude::*;

/// Above this many bytes in all, copies run on the rayon pool.
pub const PARALLEL_COPY_BYTES: usize = 1 << 20;

/// Large tensors are copied in pieces of at most this many bytes, so that
/// one big tensor spreads over the pool too.
const CHUNK_BYTES: usize = 256 << 10;

/// Copies every `(dst, src)` pair (same lengths, checked by the callers):
/// sequentially when small, else on the rayon pool, split per pair and big
/// pairs in chunks.
fn copy_pieces<T: Element>(pieces: Vec<(&mut [T], &[T])>) {
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

/// The error of a fused buffer whose length is not the tensors' total.
fn fused_length(op: &str, tensors: usize, total: usize, buffer: usize) -> TransportError {
    TransportError::InvalidArgument(format!(
        "{op}: {tensors} tensors of {total} elements in all, but the fused buffer holds {buffer}"
    ))
}

/// Copies `srcs` one after another into `dst`, which must hold exactly their
/// total length.
pub fn pack<T: Element>(dst: &mut [T], srcs: &[&[T]]) -> Result<()> {
    let total: usize = srcs.iter().map(|s| s.len()).sum();
    if total != dst.len() {
        return Err(fused_length("pack", srcs.len(), total, dst.len()));
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
/// their total length.
pub fn unpack<T: Element>(src: &[T], dsts: &mut [&mut [T]]) -> Result<()> {
    let total: usize = dsts.iter().map(|d| d.len()).sum();
    if total != src.len() {
        return Err(fused_length("unpack", dsts.len(), total, src.len()));
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

    #[test]
    fn pack_then_unpack_round_trips_small_and_large() {
        for lens in [vec![0usize, 3, 1, 0, 7], vec![300_000, 5, 200_000]] {
            let srcs: Vec<Vec<i32>> = lens
                .iter()
                .enumerate()
                .map(|(t, &n)| (0..n as i32).map(|i| i * 31 + t as i32).collect())
                .collect();
            let total = lens.iter().sum();
            let mut fused = vec![0i32; total];
            let views: Vec<&[i32]> = srcs.iter().map(Vec::as_slice).collect();
            pack(&mut fused, &views).unwrap();
            assert_eq!(fused, srcs.concat());
            let mut outs: Vec<Vec<i32>> = lens.iter().map(|&n| vec![0; n]).collect();
            let mut out_views: Vec<&mut [i32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
            unpack(&fused, &mut out_views).unwrap();
            assert_eq!(outs, srcs);
        }
    }

    #[test]
    fn a_fused_buffer_of_another_length_is_refused() {
        let mut fused = [0u8; 3];
        let err = pack(&mut fused, &[&[1u8, 2][..], &[3, 4][..]]).unwrap_err();
        assert!(err.to_string().contains("4 elements"), "{err}");
        let mut one = [0u8; 1];
        assert!(unpack(&fused, &mut [&mut one[..]]).is_err());
    }
}
