//! Fused allreduce.

use super::{observed, total_len, Edge, Phase};
use crate::buffers::FusionBuffers;
use crate::error::FusionError;
use kolo_protocol::{Device, ReduceOp};
use kolo_transport::{Collectives, Element, Memory, Scale};

/// Allreduces `tensors` (views of memory `M`) in place as one collective: a
/// single tensor runs in place without copies; several go to one
/// [`allreduce_segments`](Collectives::allreduce_segments) straight over
/// the tensors where the backend [reduces segments in
/// place](Collectives::reduces_segments_in_place) (the shared-memory
/// backend: no fusion buffer, no copies, only the `Collective` phase);
/// otherwise they are packed into the fusion buffer of `device`, reduced
/// with one `comm.allreduce` and unpacked.
///
/// Every rank calls it with the same tensor lengths, in the same order.
pub fn fused_allreduce<M: Memory, C: Collectives<M>, T: Element>(
    comm: &mut C,
    bufs: &mut FusionBuffers<M>,
    device: Device,
    tensors: &mut [M::Mut<'_, T>],
    op: ReduceOp,
    scale: Scale,
    observer: &mut dyn FnMut(Phase, Edge),
) -> Result<(), FusionError> {
    match tensors {
        [] => Ok(()),
        [only] => Ok(observed(observer, Phase::Collective, || {
            comm.allreduce(M::reborrow(only), op, scale)
        })?),
        _ if comm.reduces_segments_in_place() => Ok(observed(observer, Phase::Collective, || {
            comm.allreduce_segments(tensors, op, scale)
        })?),
        _ => {
            let total = total_len("allreduce", tensors.iter().map(M::len_mut))?;
            let mut fused = bufs.buffer::<C, T>(comm, device, total)?;
            let srcs: Vec<M::Ref<'_, T>> = tensors.iter().map(M::freeze).collect();
            observed(observer, Phase::MemcpyInFusionBuffer, || {
                comm.pack_into(&srcs, M::reborrow(&mut fused))
            })?;
            drop(srcs);
            observed(observer, Phase::Collective, || {
                comm.allreduce(M::reborrow(&mut fused), op, scale)
            })?;
            Ok(observed(observer, Phase::MemcpyOutFusionBuffer, || {
                comm.unpack_from(M::freeze(&fused), tensors)
            })?)
        }
    }
}
