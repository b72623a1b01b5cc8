//! Fused reduce-scatter (blocks may differ per rank).

use super::{check_count, check_len, checked_sum, observed, Edge, Phase};
use crate::buffers::FusionBuffers;
use crate::error::FusionError;
use crate::pack::{copy_pieces, unpack};
use kolo_protocol::{Device, ReduceOp};
use kolo_transport::{Collectives, Element, Scale};

const OP: &str = "reduce-scatter";

/// Reduces every rank's `inputs` and leaves this rank's block of each tensor
/// in `outputs`, with one reduce-scatter for all tensors.
///
/// `counts[i][r]` is the number of elements of tensor i that rank r keeps
/// (`inputs[i].len() == sum(counts[i])`, `outputs[i].len() ==
/// counts[i][rank]`). A single tensor runs without copies; several are
/// packed interleaved into the fusion buffer of `device` (rank r's blocks
/// of all tensors back to back, rank after rank), reduce-scattered, and
/// this rank's blocks unpacked.
#[allow(clippy::too_many_arguments)] // the fused response's parameters, each needed
pub fn fused_reduce_scatter<C: Collectives, T: Element>(
    comm: &mut C,
    bufs: &mut FusionBuffers,
    device: Device,
    inputs: &[&[T]],
    outputs: &mut [&mut [T]],
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
        check_len("reduce-scatter input", i, whole, input.len())?;
        check_len(
            "reduce-scatter output",
            i,
            tensor_counts[rank],
            output.len(),
        )?;
    }
    match (inputs, outputs) {
        ([], _) => Ok(()),
        ([input], [output]) => Ok(observed(observer, Phase::Collective, || {
            comm.reduce_scatter(input, output, &counts[0], op, scale)
        })?),
        (inputs, outputs) => {
            let mut fused_counts = Vec::with_capacity(size);
            for r in 0..size {
                fused_counts.push(checked_sum(OP, 0, counts.iter().map(|c| c[r]))?);
            }
            let total = checked_sum(OP, 0, fused_counts.iter().copied())?;
            let (send, recv) = bufs.get_pair::<T>(device, total, fused_counts[rank]);
            observed(observer, Phase::MemcpyInFusionBuffer, || {
                pack_interleaved(send, inputs, counts)
            });
            observed(observer, Phase::Collective, || {
                comm.reduce_scatter(send, recv, &fused_counts, op, scale)
            })?;
            observed(observer, Phase::MemcpyOutFusionBuffer, || {
                unpack(recv, outputs)
            })
        }
    }
}

/// Packs rank r's block of every tensor back to back, rank after rank.
/// The lengths were checked by the caller, so every slice is in range.
fn pack_interleaved<T: Element>(send: &mut [T], inputs: &[&[T]], counts: &[Vec<usize>]) {
    let size = counts.first().map_or(0, Vec::len);
    // Where each tensor's next block begins.
    let mut cursor = vec![0usize; inputs.len()];
    let mut pieces = Vec::new();
    let mut rest = send;
    for r in 0..size {
        for ((input, tensor_counts), start) in inputs.iter().zip(counts).zip(cursor.iter_mut()) {
            let len = tensor_counts[r];
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(len);
            pieces.push((piece, &input[*start..*start + len]));
            *start += len;
            rest = tail;
        }
    }
    copy_pieces(pieces);
}
