//! The NCCL device plane: lives on the engine's thread with the rank's
//! [`NcclComm`], performs device responses on its stream and completes
//! their handles from kolo-nccl's completion thread once the GPU is done.
//!
//! Per response: the stream waits (on the GPU) for the submitters' ready
//! events; the collective is enqueued on the tensors' addresses
//! (allreduces fused through kolo-fusion on device memory, see
//! [`super::allreduce`]); and the [`Work`](kolo_nccl::Work) of the last
//! enqueued call (or a flush) completes every tensor's handle and releases
//! the caller's memory once the GPU is done.

use super::tensor::{DeviceArgs, DeviceDone, OnDevice};
use crate::engine::batches::Order;
use crate::engine::completion::{Completion, Part as Submitted, Payload};
use crate::engine::placement::{DeviceEntry, DevicePlane};
use crate::engine::submission::{Input, Inputs, Ready};
use crate::error::Error;
use cudarc::driver::CudaStream;
use kolo_fusion::{FusionBuffers, FusionError};
use kolo_nccl::{Cuda, DeviceElement, NcclComm, NcclError, UntrackedSpace, Work};
use kolo_protocol::{DataType, RequestKind, Response};
use kolo_timeline::Timeline;
use kolo_transport::{with_element_type, Topology};
use std::any::{Any, TypeId};
use std::sync::Arc;

/// Why the plane could not perform a response on this rank.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlaneError {
    #[error(transparent)]
    Nccl(#[from] NcclError),
    #[error(transparent)]
    Fusion(#[from] FusionError),
    #[error("internal: {0}")]
    Internal(String),
}

/// What a response leaves per tensor: an output the engine allocated
/// (allgather's `CudaSlice<T>`, alltoall's [`DeviceReceived`](super::tensor::DeviceReceived)) with its
/// shape, or nothing (in-place results).
pub(crate) type Outputs = Vec<Option<Output>>;

/// One tensor's output and its shape.
pub(crate) type Output = (Box<dyn Any + Send>, Vec<u64>);

/// What enqueueing a response left: its outputs, and the [`Work`] of the
/// last call when nothing was enqueued after it (it then completes with
/// the whole response).
pub(crate) struct Enqueued {
    pub outputs: Outputs,
    pub last: Option<Work>,
}

/// Timeline activity of the NCCL allreduce (Horovod's name).
pub const NCCL_ALLREDUCE: &str = "NCCL_ALLREDUCE";
/// Timeline activity of the NCCL allgather.
pub const NCCL_ALLGATHER: &str = "NCCL_ALLGATHER";
/// Timeline activity of the NCCL broadcast.
pub const NCCL_BROADCAST: &str = "NCCL_BROADCAST";
/// Timeline activity of the NCCL reduce-scatter.
pub const NCCL_REDUCESCATTER: &str = "NCCL_REDUCESCATTER";
/// Timeline activity of the NCCL alltoall (grouped sends and receives).
pub const NCCL_ALLTOALL: &str = "NCCL_ALLTOALL";

/// The last whole submission the plane allreduced (its dtype and tensors,
/// in the collective's order) and, once the same tensors came again, their
/// persistent allreduce (a `PersistentAllreduce` of that dtype).
pub(super) struct Repeated {
    pub(super) dtype: DataType,
    pub(super) lent: Vec<(u64, usize)>,
    pub(super) plan: Option<Box<dyn Any + Send>>,
}

/// One rank's NCCL communicator and device fusion buffers.
pub(crate) struct NcclPlane {
    pub(super) comm: NcclComm,
    /// kolo-fusion's persistent buffers, in device memory.
    pub(super) buffers: FusionBuffers<Cuda>,
    /// This device's memory, to view tensors lent by address.
    pub(super) space: UntrackedSpace,
    /// The last whole submission allreduced, for a step that repeats it.
    pub(super) repeated: Option<Repeated>,
}

/// One tensor of a response on this rank.
pub(super) struct Part<T: 'static> {
    pub name: String,
    /// This rank's handle on the tensor (none where it joined).
    pub completion: Option<Submitted>,
    /// The caller's memory (none where this rank joined).
    pub args: Option<DeviceArgs<T>>,
    /// The caller's memory lent by address (an allreduce's): address and
    /// length.
    pub lent: Option<(u64, usize)>,
    /// What orders the work after the submitter's, for `lent`.
    pub ready: Option<Ready>,
    /// The shape as this rank submitted it (empty where it joined).
    pub shape: Vec<u64>,
}

impl<T: 'static> Drop for Part<T> {
    /// A part dropped before its handle completed (its work was dropped
    /// unrun, or the engine unwound) fails the handle instead of leaving
    /// it waiting; a completed handle keeps its result.
    fn drop(&mut self) {
        if let Some(completion) = self.completion.take() {
            completion.complete(Err(Error::Collective {
                tensor: self.name.clone(),
                message: "the engine dropped the device operation before it completed".into(),
            }));
        }
    }
}

impl NcclPlane {
    /// The plane of `comm` (its fusion buffers are allocated on first use).
    pub(crate) fn new(comm: NcclComm) -> Self {
        let space = UntrackedSpace::new(Arc::clone(comm.stream()));
        NcclPlane {
            comm,
            buffers: FusionBuffers::default(),
            space,
            repeated: None,
        }
    }

    fn perform_as<T: DeviceElement>(
        &mut self,
        kind: RequestKind,
        response: &Response,
        slots: Vec<Option<DeviceEntry>>,
        timeline: &Timeline,
    ) {
        let mut parts: Vec<Part<T>> = response
            .tensor_names
            .iter()
            .zip(slots)
            .map(|(name, slot)| part(name, slot))
            .collect();
        let names: Vec<&str> = response.tensor_names.iter().map(String::as_str).collect();
        let enqueued =
            self.wait_ready(&parts)
                .map_err(PlaneError::from)
                .and_then(|()| match kind {
                    RequestKind::Allreduce => {
                        self.allreduce(response, &mut parts, timeline, &names)
                    }
                    RequestKind::Broadcast => Ok(self.broadcast(response, &mut parts, timeline)?),
                    RequestKind::ReduceScatter => {
                        Ok(self.reduce_scatter(response, &mut parts, timeline)?)
                    }
                    RequestKind::Allgather => Ok(self.allgather(response, &mut parts, timeline)?),
                    RequestKind::Alltoall => Ok(self.alltoall(response, &mut parts, timeline)?),
                    other => Err(PlaneError::Internal(format!(
                        "{other} is not offered on device tensors"
                    ))),
                });
        match enqueued {
            Ok(enqueued) => self.settle(response, parts, enqueued, timeline),
            Err(e) => self.fail(parts, &e, response, timeline),
        }
    }

    /// The stream waits, on the GPU, for every submitter's ready event
    /// (once per event: a submission shares one per stream).
    fn wait_ready<T>(&self, parts: &[Part<T>]) -> Result<(), NcclError> {
        self.wait_submitted(parts.iter().filter_map(|p| p.ready.as_ref()))?;
        let mut waited: Vec<*const super::ready::ReadyEvent> = Vec::new();
        for ready in parts
            .iter()
            .filter_map(|p| p.args.as_ref())
            .flat_map(|a| &a.ready)
        {
            let event = Arc::as_ptr(ready);
            if !waited.contains(&event) {
                self.comm.wait_event(ready.get())?;
                waited.push(event);
            }
        }
        Ok(())
    }

    /// Completes every tensor with the work of this response (and
    /// everything before it on the stream): the last enqueued call's, or a
    /// flush when something followed it.
    fn settle<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: Vec<Part<T>>,
        enqueued: Enqueued,
        timeline: &Timeline,
    ) {
        let work = match enqueued.last.map_or_else(|| self.comm.flush(), Ok) {
            Ok(work) => work,
            Err(e) => return self.fail(parts, &e.into(), response, timeline),
        };
        let stream = Arc::clone(self.comm.stream());
        let mut outputs = enqueued.outputs.into_iter();
        let mut finished = Vec::with_capacity(parts.len());
        for part in parts {
            let output = outputs.next().flatten();
            let shape = output.as_ref().map_or(&part.shape, |(_, s)| s);
            timeline.op_end(&part.name, response.dtype.name(), shape);
            finished.push((part, output));
        }
        work.on_complete(move |outcome| {
            for (mut part, output) in finished {
                if outcome.is_err() {
                    part.fence(&stream);
                }
                let Some(completion) = part.completion.take() else {
                    continue;
                };
                let result = match &outcome {
                    Ok(()) => Ok(Box::new(DeviceDone { output }) as Payload),
                    Err(e) => Err(collective(&part.name, e)),
                };
                completion.complete(result);
                // `part` drops here: its lease tells the caller's scope that
                // the engine is done with the memory.
            }
        });
    }

    /// Fails every tensor with `error`; the caller's memory is released
    /// once whatever was enqueued before the failure has run.
    fn fail<T: DeviceElement>(
        &mut self,
        parts: Vec<Part<T>>,
        error: &PlaneError,
        response: &Response,
        timeline: &Timeline,
    ) {
        let mut parts = parts;
        for part in &mut parts {
            timeline.op_end(&part.name, response.dtype.name(), &[]);
            if let Some(completion) = part.completion.take() {
                completion.complete(Err(collective(&part.name, error)));
            }
        }
        let stream = Arc::clone(self.comm.stream());
        match self.comm.flush() {
            Ok(work) => work.on_complete(move |outcome| release(parts, &stream, outcome.is_err())),
            Err(_) => release(parts, &stream, true),
        }
    }
}

impl<T> Part<T> {
    /// See [`DeviceArgs::fence`].
    fn fence(&mut self, stream: &CudaStream) {
        if let Some(args) = &mut self.args {
            args.fence(stream);
        }
    }
}

/// Gives the caller's memory back; after a failure (`fence`), with the
/// buffers' cudarc events recorded behind whatever may still run.
fn release<T>(mut parts: Vec<Part<T>>, stream: &CudaStream, fence: bool) {
    if fence {
        parts.iter_mut().for_each(|p| p.fence(stream));
    }
    drop(parts);
}

impl DevicePlane for NcclPlane {
    fn ordinal(&self) -> usize {
        self.comm.device().ordinal()
    }

    fn release_buffers(&mut self) -> usize {
        self.buffers.release()
    }

    fn perform(
        &mut self,
        kind: RequestKind,
        response: &Response,
        slots: Vec<Option<DeviceEntry>>,
        timeline: &Timeline,
    ) {
        with_element_type!(response.dtype, T => self.perform_as::<T>(kind, response, slots, timeline))
    }

    fn allreduce_whole(
        &mut self,
        response: &Response,
        inputs: Inputs,
        order: &Order,
        completion: Arc<Completion>,
    ) {
        NcclPlane::allreduce_whole(self, response, inputs, order, completion);
    }
}

/// Takes `name`'s entry apart; an input of another type than the
/// response's (a kolo bug) fails the entry, and this rank takes part with
/// a placeholder.
fn part<T: DeviceElement>(name: &str, slot: Option<DeviceEntry>) -> Part<T> {
    let mut part = Part {
        name: name.to_owned(),
        completion: None,
        args: None,
        lent: None,
        ready: None,
        shape: Vec::new(),
    };
    let Some(entry) = slot else {
        return part;
    };
    let DeviceEntry {
        params,
        input,
        part: completion,
        ready,
    } = entry;
    match input {
        Input::Owned(payload) => part.args = payload.downcast::<DeviceArgs<T>>().ok().map(|a| *a),
        Input::Lent(lent) => {
            let (ptr, len, element) = lent.parts();
            if element == TypeId::of::<OnDevice<T>>() {
                part.lent = Some((ptr.as_ptr() as usize as u64, len));
                part.ready = ready;
            }
        }
        Input::None => {}
    }
    if part.args.is_none() && part.lent.is_none() {
        completion.complete(Err(Error::Collective {
            tensor: name.to_owned(),
            message: format!(
                "internal: the input is not a device tensor of the agreed type {}",
                T::DTYPE
            ),
        }));
        return part;
    }
    part.completion = Some(completion);
    part.shape = params.shape.to_vec();
    part
}

/// A failure of `tensor`'s collective.
pub(super) fn collective(tensor: &str, error: &dyn std::fmt::Display) -> Error {
    Error::Collective {
        tensor: tensor.to_owned(),
        message: error.to_string(),
    }
}

/// The rank of this plane's communicator and the number of ranks.
pub(super) fn topology(comm: &NcclComm) -> (usize, usize) {
    (comm.rank(), comm.size())
}
