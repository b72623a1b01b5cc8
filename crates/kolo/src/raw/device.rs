//! Raw CUDA tensors (the `nccl` feature): the caller's device memory
//! becomes a cudarc slice on the caller's stream (wrapped, never owned:
//! kolo lets go of it without freeing it), and then takes the GPU
//! engine's typed path — the engine's stream waits for an event recorded
//! on the caller's stream, so the collective follows the work enqueued
//! there before the call, as NCCL on PyTorch's current stream would.

use super::handle::{Keep, RawOutput};
use super::ops::Place;
use super::tensor::{RawMemory, RawTensor};
use crate::device_tensor::{DeviceReceived, DeviceTensor, DeviceTensorMut};
use crate::error::Error;
use crate::handle::Handle;
use crate::kolo::Kolo;
use crate::placed::{Placed, PlacedMut};
use crate::scope::Scope;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use kolo_protocol::RequestKind;
use kolo_transport::Element;
use parking_lot::Mutex;
use std::sync::Arc;

/// Streams wrapped and kept (a caller's streams are few and long-lived,
/// as PyTorch's pools are); past this, a stream is wrapped per call.
const MAX_STREAMS: usize = 256;

/// The caller's memory as a cudarc slice; letting go of it leaves the
/// memory to its owner.
struct Borrowed<T> {
    slice: Option<CudaSlice<T>>,
}

impl<T> Drop for Borrowed<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            // Forgets the allocation (the caller's), releasing only the
            // wrapper's own events.
            slice.leak();
        }
    }
}

/// A [`Borrowed`] behind a raw pointer: the views lent to the engine point
/// into it, so it is never moved or touched until dropped, after the
/// operation completed (the handle's keep list).
struct Lent<T>(*mut Borrowed<T>);

// SAFETY: the wrapper is only dropped through this (once, after the
// engine's last use of the views into it), and cudarc's slices are
// `Send`.
unsafe impl<T: Send> Send for Lent<T> {}

impl<T> Drop for Lent<T> {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` in `borrow`, dropped once here.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// The device memory of `tensor` as a slice on its stream, kept alive by
/// the returned keeper; the slice lives as long as the keeper.
///
/// # Safety
/// `tensor`'s memory is an allocation of the engine's GPU of at least
/// `byte_len()` bytes, used in its stream's order, until the operation
/// completed (the raw calls' contract).
unsafe fn borrow<T: Element>(
    kolo: &Kolo,
    name: &str,
    tensor: &RawTensor,
) -> Result<(&'static mut CudaSlice<T>, Keep), Error> {
    let RawMemory::Cuda { device, stream } = tensor.memory() else {
        return Err(internal(name, "a host tensor on the device path"));
    };
    match kolo.gpu() {
        Some(gpu) if gpu == device => {}
        Some(gpu) => {
            return Err(Error::InvalidArgument {
                tensor: name.to_owned(),
                reason: format!(
                    "the tensor lives on cuda:{device}, but rank {} reduces on cuda:{gpu}",
                    kolo.rank()
                ),
            })
        }
        None => {
            return Err(Error::InvalidArgument {
                tensor: name.to_owned(),
                reason: crate::engine::placement::NO_GPU_ENGINE.into(),
            })
        }
    }
    // The engine runs on this GPU, so the driver is loaded and usable.
    let stream = wrapped_stream(name, device, stream)?;
    // SAFETY: the caller vouches for the allocation and its length; the
    // slice never frees it (`Borrowed` leaks it).
    let slice = unsafe { stream.upgrade_device_ptr::<T>(tensor.data() as u64, tensor.elements()) };
    let raw = Box::into_raw(Box::new(Borrowed { slice: Some(slice) }));
    // SAFETY: `raw` is valid until the keeper drops it, after the
    // operation's last use of the slice; nothing else reaches it.
    let slice = unsafe { (*raw).slice.as_mut() }
        .unwrap_or_else(|| unreachable!("the slice was just put there"));
    Ok((slice, Box::new(Lent(raw))))
}

/// `tensor` as a writable device tensor.
///
/// # Safety
/// As [`borrow`].
pub(crate) unsafe fn place_mut<T: Element>(
    kolo: &Kolo,
    name: &str,
    tensor: &RawTensor,
) -> Result<Place<PlacedMut<'static, T>>, Error> {
    // SAFETY: the caller's contract.
    let (slice, keep) = unsafe { borrow::<T>(kolo, name, tensor)? };
    let view = DeviceTensorMut::with_shape(slice.as_view_mut(), tensor.shape());
    Ok(Place {
        tensor: PlacedMut::Device(view),
        keep: vec![keep],
    })
}

/// `tensor` as a read-only device tensor.
///
/// # Safety
/// As [`borrow`].
pub(crate) unsafe fn place<T: Element>(
    kolo: &Kolo,
    name: &str,
    tensor: &RawTensor,
) -> Result<Place<Placed<'static, T>>, Error> {
    // SAFETY: the caller's contract.
    let (slice, keep) = unsafe { borrow::<T>(kolo, name, tensor)? };
    let view = DeviceTensor::with_shape(slice.as_view(), tensor.shape());
    Ok(Place {
        tensor: Placed::Device(view),
        keep: vec![keep],
    })
}

/// Submits an allgather or an alltoall (`kind`) of the device tensor
/// `input`; the output is the engine's buffer on its GPU, with the shape
/// the engine gathered (a gather of no elements keeps a spare element in
/// its buffer, which the shape leaves out).
pub(crate) fn gather<'s, T: Element>(
    scope: &Scope<'s, '_>,
    name: &str,
    kind: RequestKind,
    input: Placed<'s, T>,
    splits: &[usize],
) -> Result<Handle<'s, Option<RawOutput>>, Error> {
    let Placed::Device(input) = input else {
        return Err(internal(name, "a host tensor on the device path"));
    };
    let gpu = scope.kolo().gpu();
    let tensor = name.to_owned();
    scope.gather_on_device_with(name, kind, input, splits, move |(buf, shape)| {
        let (slice, splits) = if kind == RequestKind::Alltoall {
            let got = buf
                .downcast::<DeviceReceived<T>>()
                .map_err(|_| internal(&tensor, "the engine's output has another type"))?;
            (got.data, got.splits)
        } else {
            let slice = buf
                .downcast::<CudaSlice<T>>()
                .map_err(|_| internal(&tensor, "the engine's output has another type"))?;
            (*slice, Vec::new())
        };
        let (ptr, read) = slice.device_ptr(slice.stream());
        drop(read);
        Ok(Some(RawOutput {
            data: ptr as usize as *const std::ffi::c_void,
            owner: Box::new(slice),
            dtype: T::DTYPE,
            shape: shape.iter().map(|&d| d as usize).collect(),
            splits,
            device: gpu,
        }))
    })
}

/// `stream` (an address; 0 is the legacy default stream) of `device`,
/// wrapped once and kept.
fn wrapped_stream(name: &str, device: usize, stream: usize) -> Result<Arc<CudaStream>, Error> {
    static STREAMS: Mutex<Vec<(usize, usize, Arc<CudaStream>)>> = Mutex::new(Vec::new());
    if let Some((.., s)) = STREAMS
        .lock()
        .iter()
        .find(|(d, s, _)| (*d, *s) == (device, stream))
    {
        return Ok(Arc::clone(s));
    }
    let context = context(name, device)?;
    // SAFETY: the caller's stream of this device (the raw calls'
    // contract), which its owner keeps alive while it hands it in; the
    // wrapper never destroys it.
    let wrapped = unsafe { context.wrap_borrowed_stream(stream as cudarc::driver::sys::CUstream) };
    let mut streams = STREAMS.lock();
    if streams.len() < MAX_STREAMS {
        streams.push((device, stream, Arc::clone(&wrapped)));
    }
    Ok(wrapped)
}

/// The primary context of `device`, retained once per process.
fn context(name: &str, device: usize) -> Result<Arc<CudaContext>, Error> {
    static CONTEXTS: Mutex<Vec<Arc<CudaContext>>> = Mutex::new(Vec::new());
    let mut contexts = CONTEXTS.lock();
    if let Some(c) = contexts.iter().find(|c| c.ordinal() == device) {
        return Ok(Arc::clone(c));
    }
    let made = CudaContext::new(device).map_err(|e| Error::Collective {
        tensor: name.to_owned(),
        message: format!("cannot use cuda:{device}'s context: {e:?}"),
    })?;
    contexts.push(Arc::clone(&made));
    Ok(made)
}

/// An internal inconsistency about `tensor`.
fn internal(tensor: &str, what: &str) -> Error {
    Error::Collective {
        tensor: tensor.to_owned(),
        message: format!("internal: {what}"),
    }
}
