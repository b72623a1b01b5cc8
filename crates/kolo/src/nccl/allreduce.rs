//! The device allreduce performer: tensors lent by address, fused through
//! kolo-fusion on device memory ([`kolo_nccl::Cuda`]) — one batched pack
//! into the persistent fusion buffer, one NCCL allreduce, one batched
//! unpack, or one in-place allreduce for a single tensor — the same
//! fusion the host engine runs. A whole submission (a repeated
//! [`crate::TensorGroup`]) costs one wait for its ready event and no
//! allocation, view or cudarc event per tensor.

use super::plane::{collective, NcclPlane, PlaneError, Repeated, NCCL_ALLREDUCE};
use super::tensor::{OnDevice, ReadyEvents};
use crate::engine::batches::{arrange, Order};
use crate::engine::completion::Completion;
use crate::engine::perform::observer;
use crate::engine::submission::{Inputs, Ready};
use cudarc::driver::{CudaSlice, DevicePtr};
use kolo_nccl::{Cuda, DeviceElement, NcclComm, NcclError, PersistentAllreduce, Untracked, Work};
use kolo_protocol::{Device, Response};
use kolo_timeline::Timeline;
use kolo_transport::{with_element_type, Scale};
use std::any::TypeId;
use std::sync::Arc;

/// The scale factors of a response.
pub(super) fn scale_of(response: &Response) -> Scale {
    Scale {
        prescale: response.prescale,
        postscale: response.postscale,
    }
}

/// A buffer of `len` copies of `fill` on `comm`'s stream (at least one
/// element: CUDA allocates no empty buffers).
pub(super) fn alloc<T: DeviceElement>(
    comm: &NcclComm,
    len: usize,
    fill: T,
) -> Result<CudaSlice<T>, NcclError> {
    comm.stream()
        .clone_htod(&vec![fill; len.max(1)])
        .map_err(NcclError::on_cuda("cuMemcpyHtoDAsync"))
}

/// The device address of `buf`, a buffer of the plane's stream (its uses
/// are ordered on that stream, so nothing is tracked).
pub(super) fn address<T>(comm: &NcclComm, buf: &CudaSlice<T>) -> u64 {
    let (ptr, guard) = buf.device_ptr(comm.stream());
    // Recording the read now would precede the work that reads it; the
    // buffer is freed in the stream's order, after that work.
    std::mem::forget(guard);
    ptr
}

impl NcclPlane {
    /// The stream waits, on the GPU, for the ready events of every
    /// submission in `ready` (each once: the tensors of one submission
    /// share them).
    pub(super) fn wait_submitted<'r>(
        &self,
        ready: impl IntoIterator<Item = &'r Ready>,
    ) -> Result<(), NcclError> {
        let mut waited: Vec<*const ()> = Vec::new();
        for ready in ready {
            let key = Arc::as_ptr(ready).cast::<()>();
            if waited.contains(&key) {
                continue;
            }
            waited.push(key);
            if let Some(events) = ready.downcast_ref::<ReadyEvents>() {
                for event in events.events() {
                    self.comm.wait_event(event.get())?;
                }
            }
        }
        Ok(())
    }

    /// Allreduces the device memory at `lent` (addresses and lengths, in
    /// order; the stream has waited for its submitters) in place as one
    /// fused collective with `response`'s op and scales; the returned work
    /// completes once the device is done with it.
    pub(super) fn fused_allreduce<T: DeviceElement>(
        &mut self,
        response: &Response,
        lent: impl ExactSizeIterator<Item = (u64, usize)>,
        names: &[&str],
        timeline: &Timeline,
    ) -> Result<Work, PlaneError> {
        let NcclPlane {
            comm,
            buffers,
            space,
            ..
        } = self;
        let mut views = Vec::with_capacity(lent.len());
        for (ptr, len) in lent {
            // SAFETY: every address is a lent tensor's (a live cudarc view
            // of `T` on this device, checked at submission) or a stand-in
            // the caller keeps until this work is enqueued and frees in
            // the stream's order. A lent tensor's scope does not end
            // before the work returned here completed (its submission is
            // completed then, which returns its lease); the stream waited
            // for the submitter's ready event; the tensors of a submission
            // are distinct views, and no other view of them is used.
            let view = unsafe { space.view_mut::<T>(ptr, len) }.ok_or_else(|| {
                NcclError::InvalidArgument(format!(
                    "a device tensor at {ptr:#x} is not aligned to {}",
                    T::DTYPE
                ))
            })?;
            views.push(view);
        }
        let device = Device::Cuda(comm.device().ordinal() as u32);
        kolo_fusion::fused_allreduce::<Cuda, NcclComm, T>(
            comm,
            buffers,
            device,
            &mut views,
            response.reduce_op,
            scale_of(response),
            &mut observer(timeline, names, NCCL_ALLREDUCE),
        )?;
        drop(views);
        Ok(comm.flush()?)
    }

    /// See [`crate::engine::placement::DevicePlane::allreduce_whole`].
    pub(super) fn allreduce_whole_as<T: DeviceElement>(
        &mut self,
        response: &Response,
        inputs: Inputs,
        order: &Order,
        completion: Arc<Completion>,
    ) {
        let enqueued = match inputs.device(TypeId::of::<OnDevice<T>>()) {
            Some(lent) => {
                let lent = arrange(order, lent.collect());
                self.wait_submitted(inputs.device_ready())
                    .map_err(PlaneError::from)
                    .and_then(|()| self.whole_allreduce::<T>(response, lent))
            }
            None => self.stand_ins::<T>(response, &arrange(order, inputs.lent_lens())),
        };
        // The ready events may go back to their pool: the waits are enqueued.
        drop(inputs);
        match enqueued {
            Ok(work) => work.on_complete(move |outcome| match outcome {
                Ok(()) => completion.complete_all_ok(),
                Err(e) => completion.fail_open(|tensor| collective(tensor, &e)),
            }),
            Err(error) => {
                // Whatever was enqueued before the failure still runs on
                // the caller's memory: the scope waits for it through a
                // flush.
                let message = error.to_string();
                let fail = move || completion.fail_open(|tensor| collective(tensor, &message));
                match self.comm.flush() {
                    Ok(work) => work.on_complete(move |_| fail()),
                    Err(_) => fail(),
                }
            }
        }
    }

    /// The fused allreduce of a whole submission's tensors `lent` (in the
    /// collective's order; the stream has waited for the submitters): the
    /// persistent allreduce of the same tensors when the last whole
    /// submission was them too (a training step repeating), which costs
    /// three launches; otherwise kolo-fusion's, and the tensors are
    /// remembered.
    fn whole_allreduce<T: DeviceElement>(
        &mut self,
        response: &Response,
        lent: Vec<(u64, usize)>,
    ) -> Result<Work, PlaneError> {
        let NcclPlane { comm, repeated, .. } = self;
        if let [(ptr, len)] = lent[..] {
            // One tensor: reduced in place, its work the step's (no pack,
            // no second event to record).
            // SAFETY: as for a persistent allreduce below: a lent device
            // tensor of `len` elements of `T`, live until the returned work
            // completes, the stream ordered after its submitter.
            let mut buf = unsafe { Untracked::<T>::from_raw(ptr, len, Arc::clone(comm.stream())) };
            return Ok(comm.all_reduce(&mut buf, response.reduce_op, scale_of(response))?);
        }
        match repeated {
            Some(last) if last.dtype == T::DTYPE && last.lent == lent => {
                if last.plan.is_none() {
                    let plan = PersistentAllreduce::<T>::new(comm, lent)?;
                    last.plan = Some(Box::new(plan));
                }
                let plan = last
                    .plan
                    .as_mut()
                    .and_then(|plan| plan.downcast_mut::<PersistentAllreduce<T>>())
                    .ok_or_else(|| {
                        PlaneError::Internal("a persistent allreduce of another type".into())
                    })?;
                // SAFETY: the tensors are this submission's, lent by
                // address (live device memory of `T` on this device,
                // checked at submission, disjoint views) until the work
                // returned here completes, which completes the submission
                // and returns its lease; the stream waited for the
                // submitters' ready events (the caller).
                Ok(unsafe { plan.run(comm, response.reduce_op, scale_of(response)) }?)
            }
            _ => {
                *repeated = Some(Repeated {
                    dtype: T::DTYPE,
                    lent: lent.clone(),
                    plan: None,
                });
                self.fused_allreduce::<T>(response, lent.into_iter(), &[], &Timeline::disabled())
            }
        }
    }

    /// Takes part in a whole submission's allreduce whose inputs are not
    /// device tensors of `T` (a kolo bug) with the op's identity in
    /// tensors of `lens` elements, then fails it.
    fn stand_ins<T: DeviceElement>(
        &mut self,
        response: &Response,
        lens: &[usize],
    ) -> Result<Work, PlaneError> {
        let fill = T::identity(response.reduce_op);
        let spares: Vec<CudaSlice<T>> = lens
            .iter()
            .map(|&len| alloc(&self.comm, len, fill))
            .collect::<Result<_, _>>()?;
        let lent: Vec<(u64, usize)> = spares
            .iter()
            .zip(lens)
            .map(|(buf, &len)| (address(&self.comm, buf), len))
            .collect();
        let work =
            self.fused_allreduce::<T>(response, lent.into_iter(), &[], &Timeline::disabled())?;
        drop((work, spares));
        Err(PlaneError::Internal(format!(
            "the inputs are not device tensors of {}",
            T::DTYPE
        )))
    }

    /// Dispatches [`NcclPlane::allreduce_whole_as`] on the response's dtype.
    pub(super) fn allreduce_whole(
        &mut self,
        response: &Response,
        inputs: Inputs,
        order: &Order,
        completion: Arc<Completion>,
    ) {
        with_element_type!(response.dtype, T => self.allreduce_whole_as::<T>(response, inputs, order, completion))
    }
}
