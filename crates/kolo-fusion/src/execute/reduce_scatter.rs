//! Fused reduce-scatter (blocks may differ per rank).

use super::{check_count, check_len, checked_sum, observed, Edge, Phase};
use crate::buffers::FusionBuffers;
use crate::error::FusionError;
use kolo_protocol::{Device, ReduceOp};
use kolo_transport::{Collectives, Element, Memory, Scale};

const OP: &str = "reduce-scatter";

/// Reduces every rank's `inputs` (views of memory `M`) and leaves this rank's block of each tensor
/// in `outputs`, with one reduce-scatter for all tensors.
///
/// `counts[i][r]` is the number of elements of tensor i that rank r keeps
/// (`inputs[i].len() == sum(counts[i])`, `outputs[i].len() ==
/// counts[i][rank]`). A single tensor runs without copies; several are
/// packed interleaved into the fusion buffer of `device` (rank r's blocks
/// of all tensors back to back, rank after rank), reduce-scattered, and
/// this rank's blocks unpacked.
#[allow(clippy::too_many_arguments)] // the fused response's parameters, each needed
pub fn fused_reduce_scatter<M: Memory, C: Collectives<M>, T: Element>(
    comm: &mut C,
    bufs: &mut FusionBuffers<M>,
    device: Device,
    inputs: &[M::Ref<'_, T>],
    outputs: &mut [M::Mut<'_, T>],
    counts: &[Vec<usize>],
    op: ReduceOp,
    scale: Scale,
    observer: &mut dyn FnMut(Phase, Edge),
) -> Result<(), FusionError> {
    let (rank, size) = (comm.rank(), comm.size());
    check_count(OP, "outputs", inputs.len(), outputs.len())?;
    check_count(OP, "counts", inputs.len(), counts.len())?;
    for (i, ((input, output), tensor_counts)) in
        inputs.iter().zip(outputs.iter()).zip(counts).enumerate()
    {
        check_count(OP, format!("counts[{i}]"), size, tensor_counts.len())?;
        let whole = checked_sum(OP, i, tensor_counts.iter().copied())?;
        check_len("reduce-scatter input", i, whole, M::len(*input))?;
        check_len(
            "reduce-scatter output",
            i,
            tensor_counts[rank],
            M::len_mut(output),
        )?;
    }
    match (inputs, outputs) {
        ([], _) => Ok(()),
        ([input], [output]) => Ok(observed(observer, Phase::Collective, || {
            comm.reduce_scatter(*input, M::reborrow(output), &counts[0], op, scale)
        })?),
        (inputs, outputs) => {
            let mut fused_counts = Vec::with_capacity(size);
            for r in 0..size {
                fused_counts.push(checked_sum(OP, 0, counts.iter().map(|c| c[r]))?);
            }
            let total = checked_sum(OP, 0, fused_counts.iter().copied())?;
            let (mut send, mut recv) =
                bufs.buffer_pair::<C, T>(comm, device, total, fused_counts[rank])?;
            observed(observer, Phase::MemcpyInFusionBuffer, || {
                let srcs = interleaved_pieces::<M, T>(inputs, counts, size);
                comm.pack_into(&srcs, M::reborrow(&mut send))
            })?;
            observed(observer, Phase::Collective, || {
                comm.reduce_scatter(
                    M::freeze(&send),
                    M::reborrow(&mut recv),
                    &fused_counts,
                    op,
                    scale,
                )
            })?;
            Ok(observed(observer, Phase::MemcpyOutFusionBuffer, || {
                comm.unpack_from(M::freeze(&recv), outputs)
            })?)
        }
    }
}

/// The blocks of `inputs` in the order of the fused send buffer: rank r's
/// block of every tensor back to back, rank after rank. The lengths were
/// checked by the caller, so every block is in range.
fn interleaved_pieces<'a, M: Memory, T: Element>(
    inputs: &[M::Ref<'a, T>],
    counts: &[Vec<usize>],
    size: usize,
) -> Vec<M::Ref<'a, T>> {
    // What is left of each input, after the ranks' blocks taken so far.
    let mut rests = inputs.to_vec();
    let mut pieces = Vec::with_capacity(inputs.len().saturating_mul(size));
    for r in 0..size {
        for (rest, tensor_counts) in rests.iter_mut().zip(counts) {
            let (piece, tail) = M::split_at(*rest, tensor_counts[r]);
            pieces.push(piece);
            *rest = tail;
        }
    }
    pieces
}
