//! Device tensors as the engine receives them (`DeviceArgs`:
//! lifetime-erased views and their addresses, the ready events, and a
//! `Lease` that tells the caller's scope when the engine is done with the
//! memory); the caller's side is `crate::device_tensor`.

use super::ready::ReadyEvent;
use crate::engine::lease::Lease;
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use kolo_nccl::Untracked;
use std::sync::Arc;

/// The caller's memory the engine works on for one tensor, with the
/// borrow's lifetime erased: the [`Lease`] keeps the caller's scope
/// waiting until this value is dropped (see `Scope`).
///
/// The engine works on the addresses (`read`, `write`): no cudarc event
/// per tensor and use. The views stay for the failure path, where the
/// engine records their events after whatever it enqueued (`fence`).
pub(crate) struct DeviceArgs<T: 'static> {
    /// The input of an out-of-place operation (allgather, reduce-scatter).
    pub input: Option<CudaView<'static, T>>,
    /// The buffer written: in place (allreduce, broadcast) or the output
    /// (reduce-scatter).
    pub output: Option<CudaViewMut<'static, T>>,
    /// `input`'s memory, ordered after its last write by the ready event.
    pub read: Option<Untracked<T>>,
    /// `output`'s memory, ordered after its last uses by the ready event.
    pub write: Option<Untracked<T>>,
    /// Recorded on the streams of the tensor's buffers at submission,
    /// after the waits for the buffers' cudarc events; the engine's stream
    /// waits for them on the GPU before touching the memory.
    pub ready: Vec<Arc<ReadyEvent>>,
    /// Released (dropped) when the engine no longer refers to the memory.
    pub _lease: Lease,
}

impl<T> DeviceArgs<T> {
    /// Records the views' cudarc events on `stream` after everything
    /// enqueued there: once the engine gives the memory back after a
    /// failure (work that may still run), a later use or free of the
    /// caller's buffers waits for it on the GPU.
    pub(crate) fn fence(&mut self, stream: &CudaStream) {
        if let Some(view) = &self.input {
            // The guard records the view's read event when it drops.
            let (_ptr, _read) = view.device_ptr(stream);
        }
        if let Some(view) = &mut self.output {
            let (_ptr, _written) = view.device_ptr_mut(stream);
        }
    }
}

/// What the engine hands back for one device tensor: an output it
/// allocated (allgather's `CudaSlice<T>`), if any. The handle completes
/// once the GPU work has completed, so the caller's streams need no event
/// to wait for.
pub(crate) struct DeviceDone {
    /// The buffer the engine allocated, and its shape.
    pub output: Option<super::plane::Output>,
}

/// The memory and element type of device tensors lent to the engine by
/// address (`Inputs::Device`'s element: not an `Element` type, so the
/// host side never views them).
pub(crate) struct OnDevice<T>(std::marker::PhantomData<T>);

/// The ready event of a stream, recorded once per submission and shared by
/// the tensors on that stream.
#[derive(Default)]
pub(crate) struct ReadyEvents {
    recorded: Vec<(Arc<CudaStream>, Arc<ReadyEvent>)>,
}

impl ReadyEvents {
    /// The event recorded on `stream` by this submission (recorded now on
    /// first use).
    pub(crate) fn on(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<Arc<ReadyEvent>, cudarc::driver::DriverError> {
        if let Some((_, event)) = self.recorded.iter().find(|(s, _)| Arc::ptr_eq(s, stream)) {
            return Ok(Arc::clone(event));
        }
        let event = Arc::new(ReadyEvent::record(stream)?);
        self.recorded.push((Arc::clone(stream), Arc::clone(&event)));
        Ok(event)
    }

    /// The events recorded.
    pub(crate) fn events(&self) -> impl Iterator<Item = &ReadyEvent> {
        self.recorded.iter().map(|(_, event)| &**event)
    }
}
