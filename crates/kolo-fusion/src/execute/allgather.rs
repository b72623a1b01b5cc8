//! Fused allgather (first dimension may differ per rank).

use super::{check_count, check_len, checked_sum, observed, Edge, Phase};
use crate::buffers::FusionBuffers;
use crate::error::FusionError;
use crate::pack::{copy_pieces, pack};
use kolo_protocol::Device;
use kolo_transport::{Collectives, Element};

const OP: &str = "allgather";

/// Elements of every tensor from every rank: `blocks[i][r] =
/// first_dims[i * size + r] * row_elems[i]`.
fn block_sizes(
    row_elems: &[usize],
    first_dims: &[u64],
    size: usize,
) -> Result<Vec<Vec<usize>>, FusionError> {
    row_elems
        .iter()
        .enumerate()
        .map(|(i, &row)| {
            first_dims[i * size..(i + 1) * size]
                .iter()
                .map(|&dim| {
                    usize::try_from(dim)
                        .ok()
                        .and_then(|dim| dim.checked_mul(row))
                        .ok_or(FusionError::Overflow { op: OP, tensor: i })
                })
                .collect()
        })
        .collect()
}

/// Gathers every rank's `inputs` with one allgatherv and returns, per tensor,
/// the concatenation of all ranks' pieces along dimension 0 in rank order.
///
/// `row_elems[i]` is the number of elements in one dim-0 row of tensor i;
/// `first_dims` is tensor-major: rank r's first dimension of tensor i is at
/// `i * size + r` (the fused response's `first_dims`). A single tensor is
/// gathered straight into its output; several are packed into the fusion
/// buffer of `device` (this rank's inputs back to back) and unpacked from
/// the gathered buffer.
pub fn fused_allgather<C: Collectives, T: Element>(
    comm: &mut C,
    bufs: &mut FusionBuffers,
    device: Device,
    inputs: &[&[T]],
    row_elems: &[usize],
    first_dims: &[u64],
    observer: &mut dyn FnMut(Phase, Edge),
) -> Result<Vec<Vec<T>>, FusionError> {
    let (rank, size) = (comm.rank(), comm.size());
    check_count(OP, "row_elems", inputs.len(), row_elems.len())?;
    let expected_dims = inputs
        .len()
        .checked_mul(size)
        .ok_or(FusionError::Overflow { op: OP, tensor: 0 })?;
    check_count(OP, "first_dims", expected_dims, first_dims.len())?;
    let blocks = block_sizes(row_elems, first_dims, size)?;
    for (i, (input, block)) in inputs.iter().zip(&blocks).enumerate() {
        check_len("allgather input", i, block[rank], input.len())?;
    }
    let mut counts = Vec::with_capacity(size);
    for r in 0..size {
        counts.push(checked_sum(OP, 0, blocks.iter().map(|b| b[r]))?);
    }
    let mut outputs = Vec::with_capacity(inputs.len());
    for (i, block) in blocks.iter().enumerate() {
        outputs.push(vec![
            T::default();
            checked_sum(OP, i, block.iter().copied())?
        ]);
    }
    let total = checked_sum(OP, 0, counts.iter().copied())?;

    if let ([input], [output]) = (inputs, outputs.as_mut_slice()) {
        observed(observer, Phase::Collective, || {
            comm.allgatherv(input, output, &counts)
        })?;
    } else if !inputs.is_empty() {
        let (send, recv) = bufs.get_pair::<T>(device, counts[rank], total);
        observed(observer, Phase::MemcpyInFusionBuffer, || pack(send, inputs))?;
        observed(observer, Phase::Collective, || {
            comm.allgatherv(send, recv, &counts)
        })?;
        observed(observer, Phase::MemcpyOutFusionBuffer, || {
            unpack_gathered(recv, &blocks, &counts, &mut outputs)
        });
    }
    Ok(outputs)
}

/// Copies the gathered buffer (rank after rank, each rank's tensors back to
/// back) into the per-tensor outputs (each rank's rows in rank order).
/// The sizes come from `block_sizes`, so every slice is in range.
fn unpack_gathered<T: Element>(
    recv: &[T],
    blocks: &[Vec<usize>],
    counts: &[usize],
    outputs: &mut [Vec<T>],
) {
    // Where each rank's part begins in `recv`, advanced tensor by tensor.
    let mut cursor: Vec<usize> = counts
        .iter()
        .scan(0, |start, &count| {
            let here = *start;
            *start += count;
            Some(here)
        })
        .collect();
    let mut pieces = Vec::new();
    for (output, block) in outputs.iter_mut().zip(blocks) {
        let mut rest = output.as_mut_slice();
        for (&len, start) in block.iter().zip(cursor.iter_mut()) {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(len);
            pieces.push((piece, &recv[*start..*start + len]));
            *start += len;
            rest = tail;
        }
    }
    copy_pieces(pieces);
}
