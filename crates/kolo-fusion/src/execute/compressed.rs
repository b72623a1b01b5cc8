//! Allreduce with compression (Horovod's `Compression.fp16`): the tensors
//! are packed into a fusion buffer of a 16-bit type, cast on the way in,
//! reduced there, and cast back on the way out. Half the bytes travel; the
//! result is the reduction of the rounded values, in the 16-bit type's
//! precision (see [`Compression`]).

use super::{observed, total_len, Edge, Phase};
use crate::buffers::FusionBuffers;
use crate::error::FusionError;
use half::{bf16, f16};
use kolo_protocol::{Compression, Device, ReduceOp};
use kolo_transport::{Collectives, Element, Host, Scale};

/// Allreduces `tensors` (host memory) in place as one collective, their
/// data travelling as `compression` says: for `f32` and `f64` tensors with
/// a compression, cast to `f16` or `bf16` (prescaled on the way in), one
/// allreduce in that type, cast back (postscaled, and divided by the number
/// of ranks for an average, on the way out); anything else as
/// [`super::fused_allreduce`] does.
///
/// Every rank calls it with the same tensor lengths, in the same order,
/// and the same compression.
#[allow(clippy::too_many_arguments)] // the fused allreduce's, and the compression
pub fn compressed_allreduce<C: Collectives<Host>, T: Element>(
    comm: &mut C,
    bufs: &mut FusionBuffers<Host>,
    device: Device,
    tensors: &mut [&mut [T]],
    op: ReduceOp,
    scale: Scale,
    compression: Compression,
    observer: &mut dyn FnMut(Phase, Edge),
) -> Result<(), FusionError> {
    if !compression.applies_to(T::DTYPE) {
        return super::fused_allreduce(comm, bufs, device, tensors, op, scale, observer);
    }
    match compression {
        Compression::Bf16 => travel::<C, T, bf16>(comm, bufs, device, tensors, op, scale, observer),
        _ => travel::<C, T, f16>(comm, bufs, device, tensors, op, scale, observer),
    }
}

/// [`compressed_allreduce`] through the wire type `W`.
fn travel<C: Collectives<Host>, T: Element, W: Element>(
    comm: &mut C,
    bufs: &mut FusionBuffers<Host>,
    device: Device,
    tensors: &mut [&mut [T]],
    op: ReduceOp,
    scale: Scale,
    observer: &mut dyn FnMut(Phase, Edge),
) -> Result<(), FusionError> {
    let total = total_len("allreduce", tensors.iter().map(|t| t.len()))?;
    if total == 0 {
        return Ok(());
    }
    let size = comm.size();
    let wire = bufs.buffer::<C, W>(comm, device, total)?;
    let prescale = scale.prescale;
    observed(observer, Phase::MemcpyInFusionBuffer, || {
        let mut at = 0;
        for tensor in tensors.iter() {
            for (to, from) in wire[at..at + tensor.len()].iter_mut().zip(tensor.iter()) {
                *to = W::from_f64(from.to_f64() * prescale);
            }
            at += tensor.len();
        }
    });
    // An average is a sum in the wire type, divided on the way out: the
    // division by the number of ranks is exact there, not rounded twice.
    let wire_op = match op {
        ReduceOp::Average => ReduceOp::Sum,
        other => other,
    };
    observed(observer, Phase::Collective, || {
        comm.allreduce(&mut wire[..], wire_op, Scale::NONE)
    })?;
    let postscale = scale.postscale_for(op, size);
    observed(observer, Phase::MemcpyOutFusionBuffer, || {
        let mut at = 0;
        for tensor in tensors.iter_mut() {
            for (to, from) in tensor.iter_mut().zip(&wire[at..]) {
                *to = T::from_f64(from.to_f64() * postscale);
            }
            at += tensor.len();
        }
    });
    Ok(())
}
