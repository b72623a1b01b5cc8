//! Allreduce with compression (Horovod's `Compression.fp16`): the tensors
//! are packed into a fusion buffer of a 16-bit type, cast on the way in,
//! reduced there, and cast back on the way out. Half the bytes travel; the
//! result is the reduction of the rounded values, in the 16-bit type's
//! precision (see [`Compression`]).

use super::{observed, total_len, Edge, Phase};
use crate::buffers::FusionBuffers;
use crate::error::FusionError;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kolo_protocol::{Compression, DataType, Device, ReduceOp};
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
            narrow(tensor, &mut wire[at..at + tensor.len()], prescale);
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
            let len = tensor.len();
            widen(&wire[at..at + len], tensor, postscale);
            at += len;
        }
    });
    Ok(())
}

/// `src` as `f32`s, when `T` is `f32`.
fn as_f32<T: Element>(src: &[T]) -> Option<&[f32]> {
    (T::DTYPE == DataType::F32).then(|| {
        // SAFETY: `f32` is the only element type whose dtype is F32, so
        // `T` is `f32`: same size, alignment and bit validity.
        unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<f32>(), src.len()) }
    })
}

/// `dst` as `f32`s, when `T` is `f32`.
fn as_f32_mut<T: Element>(dst: &mut [T]) -> Option<&mut [f32]> {
    (T::DTYPE == DataType::F32).then(|| {
        // SAFETY: as in `as_f32`; the borrow of `dst` is handed on whole.
        unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<f32>(), dst.len()) }
    })
}

/// `W` viewed as the 16-bit type it is (by its dtype).
enum Wire<'a> {
    F16(&'a mut [f16]),
    Bf16(&'a mut [bf16]),
}

fn wire_mut<W: Element>(wire: &mut [W]) -> Option<Wire<'_>> {
    let (ptr, len) = (wire.as_mut_ptr(), wire.len());
    match W::DTYPE {
        // SAFETY: `f16` is the only element type whose dtype is F16, so the
        // cast is to `W` itself; the borrow of `wire` is handed on whole.
        DataType::F16 => Some(Wire::F16(unsafe {
            std::slice::from_raw_parts_mut(ptr.cast::<f16>(), len)
        })),
        // SAFETY: likewise, `bf16` is the only BF16.
        DataType::BF16 => Some(Wire::Bf16(unsafe {
            std::slice::from_raw_parts_mut(ptr.cast::<bf16>(), len)
        })),
        _ => None,
    }
}

/// `W` viewed, read only, as the 16-bit type it is.
enum WireRef<'a> {
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

fn wire_ref<W: Element>(wire: &[W]) -> Option<WireRef<'_>> {
    let (ptr, len) = (wire.as_ptr(), wire.len());
    match W::DTYPE {
        // SAFETY: as in `wire_mut`, the cast is to `W` itself (`f16`).
        DataType::F16 => Some(WireRef::F16(unsafe {
            std::slice::from_raw_parts(ptr.cast::<f16>(), len)
        })),
        // SAFETY: likewise (`bf16`).
        DataType::BF16 => Some(WireRef::Bf16(unsafe {
            std::slice::from_raw_parts(ptr.cast::<bf16>(), len)
        })),
        _ => None,
    }
}

/// Casts `src` (times `prescale`) into the wire type: `f32` without a
/// factor through `half`'s slice conversions (vectorised where the CPU
/// converts halves), anything else element by element.
fn narrow<T: Element, W: Element>(src: &[T], dst: &mut [W], prescale: f64) {
    if prescale == 1.0 {
        if let Some(src) = as_f32(src) {
            match wire_mut(dst) {
                Some(Wire::F16(dst)) => return dst.convert_from_f32_slice(src),
                Some(Wire::Bf16(dst)) => return dst.convert_from_f32_slice(src),
                None => {}
            }
        }
    }
    for (to, from) in dst.iter_mut().zip(src) {
        *to = W::from_f64(from.to_f64() * prescale);
    }
}

/// Casts the wire type back into `dst` (times `postscale`): `f32` through
/// `half`'s slice conversions and one scaling pass, anything else element
/// by element.
fn widen<W: Element, T: Element>(src: &[W], dst: &mut [T], postscale: f64) {
    if let Some(dst32) = as_f32_mut(dst) {
        let converted = match wire_ref(src) {
            Some(WireRef::F16(src)) => {
                src.convert_to_f32_slice(dst32);
                true
            }
            Some(WireRef::Bf16(src)) => {
                src.convert_to_f32_slice(dst32);
                true
            }
            None => false,
        };
        if converted {
            if postscale != 1.0 {
                T::scale(dst, postscale);
            }
            return;
        }
    }
    for (to, from) in dst.iter_mut().zip(src) {
        *to = T::from_f64(from.to_f64() * postscale);
    }
}
