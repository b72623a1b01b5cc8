//! Fused allgather (first dimension may differ per rank).

use super::{check_count, check_len, checked_sum, observed, Edge, Phase};
use crate::buffers::FusionBuffers;
use crate::error::FusionError;
use kolo_protocol::Device;
use kolo_transport::{Collectives, Element, Memory};

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

/// Gathers every rank's `inputs` (views of memory `M`) with one
/// allgatherv and returns, per tensor, a new buffer of `M` holding the
/// concatenation of all ranks' pieces along dimension 0 in rank order.
///
/// `row_elems[i]` is the number of elements in one dim-0 row of tensor i;
/// `first_dims` is tensor-major: rank r's first dimension of tensor i is at
/// `i * size + r` (the fused response's `first_dims`). A single tensor is
/// gathered straight into its output; several are packed into the fusion
/// buffer of `device` (this rank's inputs back to back) and unpacked from
/// the gathered buffer.
pub fn fused_allgather<M: Memory, C: Collectives<M>, T: Element>(
    comm: &mut C,
    bufs: &mut FusionBuffers<M>,
    device: Device,
    inputs: &[M::Ref<'_, T>],
    row_elems: &[usize],
    first_dims: &[u64],
    observer: &mut dyn FnMut(Phase, Edge),
) -> Result<Vec<M::Owned<T>>, FusionError> {
    let (rank, size) = (comm.rank(), comm.size());
    check_count(OP, "row_elems", inputs.len(), row_elems.len())?;
    let expected_dims = inputs
        .len()
        .checked_mul(size)
        .ok_or(FusionError::Overflow { op: OP, tensor: 0 })?;
    check_count(OP, "first_dims", expected_dims, first_dims.len())?;
    let blocks = block_sizes(row_elems, first_dims, size)?;
    for (i, (input, block)) in inputs.iter().zip(&blocks).enumerate() {
        check_len("allgather input", i, block[rank], M::len(*input))?;
    }
    let mut counts = Vec::with_capacity(size);
    for r in 0..size {
        counts.push(checked_sum(OP, 0, blocks.iter().map(|b| b[r]))?);
    }
    let mut outputs = Vec::with_capacity(inputs.len());
    for (i, block) in blocks.iter().enumerate() {
        let len = checked_sum(OP, i, block.iter().copied())?;
        let output = comm.new_buffer::<T>(len)?;
        let allocated = M::owned_len(&output);
        if allocated < len {
            return Err(FusionError::ShortAllocation {
                what: format!("allgather output {i}"),
                device,
                dtype: T::DTYPE,
                requested: len,
                allocated,
            });
        }
        outputs.push(output);
    }
    let total = checked_sum(OP, 0, counts.iter().copied())?;

    if let ([input], [output]) = (inputs, outputs.as_mut_slice()) {
        observed(observer, Phase::Collective, || {
            comm.allgatherv(*input, M::view_mut(output), &counts)
        })?;
    } else if !inputs.is_empty() {
        let (mut send, mut recv) = bufs.buffer_pair::<C, T>(comm, device, counts[rank], total)?;
        observed(observer, Phase::MemcpyInFusionBuffer, || {
            comm.pack_into(inputs, M::reborrow(&mut send))
        })?;
        observed(observer, Phase::Collective, || {
            comm.allgatherv(M::freeze(&send), M::reborrow(&mut recv), &counts)
        })?;
        observed(observer, Phase::MemcpyOutFusionBuffer, || {
            let mut dsts = gathered_pieces::<M, T>(&mut outputs, &blocks, size);
            comm.unpack_from(M::freeze(&recv), &mut dsts)
        })?;
    }
    Ok(outputs)
}

/// The pieces of the per-tensor outputs in the order of the gathered
/// buffer (rank after rank, each rank's tensors back to back): rank r's
/// rows of tensor i come after rank r's rows of the tensors before i. The
/// outputs were allocated from `blocks` (and checked to be long enough),
/// so every piece is in range.
fn gathered_pieces<'a, M: Memory, T: Element>(
    outputs: &'a mut [M::Owned<T>],
    blocks: &[Vec<usize>],
    size: usize,
) -> Vec<M::Mut<'a, T>> {
    // What is left of each output, after the ranks handed out so far.
    let mut rests: Vec<Option<M::Mut<'a, T>>> =
        outputs.iter_mut().map(|o| Some(M::view_mut(o))).collect();
    let mut pieces = Vec::with_capacity(blocks.len().saturating_mul(size));
    for r in 0..size {
        for (rest, block) in rests.iter_mut().zip(blocks) {
            if let Some(whole) = rest.take() {
                let (piece, tail) = M::split_at_mut(whole, block[r]);
                pieces.push(piece);
                *rest = Some(tail);
            }
        }
    }
    pieces
}
