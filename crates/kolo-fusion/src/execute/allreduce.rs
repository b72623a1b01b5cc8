//! Fused allreduce.

use super::{observed, Edge, Phase};
use crate::buffers::FusionBuffers;
use crate::error::FusionError;
use crate::pack::{pack, unpack};
use kolo_protocol::{Device, ReduceOp};
use kolo_transport::{Collectives, Element, Scale};

/// Allreduces `tensors` in place as one collective: a single tensor runs in
/// place without copies; several go to one
/// [`allreduce_segments`](Collectives::allreduce_segments) straight over
/// the tensors where the backend [reduces segments in
/// place](Collectives::reduces_segments_in_place) (the shared-memory
/// backend: no fusion buffer, no copies, only the `Collective` phase);
/// otherwise they are packed into the fusion buffer of `device`, reduced
/// with one `comm.allreduce` and unpacked.
///
/// Every rank calls it with the same tensor lengths, in the same order.
pub fn fused_allreduce<C: Collectives, T: Element>(
    comm: &mut C,
    bufs: &mut FusionBuffers,
    device: Device,
    tensors: &mut [&mut [T]],
    op: ReduceOp,
    scale: Scale,
    observer: &mut dyn FnMut(Phase, Edge),
) -> Result<(), FusionError> {
    match tensors {
        [] => Ok(()),
        [only] => Ok(observed(observer, Phase::Collective, || {
            comm.allreduce(only, op, scale)
        })?),
        _ if comm.reduces_segments_in_place() => Ok(observed(observer, Phase::Collective, || {
            comm.allreduce_segments(tensors, op, scale)
        })?),
        _ => {
            let total = tensors.iter().map(|t| t.len()).sum();
            let fused = bufs.get::<T>(device, total);
            let srcs: Vec<&[T]> = tensors.iter().map(|t| &**t).collect();
            observed(observer, Phase::MemcpyInFusionBuffer, || pack(fused, &srcs))?;
            observed(observer, Phase::Collective, || {
                comm.allreduce(fused, op, scale)
            })?;
            observed(observer, Phase::MemcpyOutFusionBuffer, || {
                unpack(fused, tensors)
            })
        }
    }
}
