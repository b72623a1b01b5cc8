//! Device collectives: the scope's calls ([`crate::Scope`], and the
//! blocking calls on [`crate::Kolo`], which run in a scope of their own)
//! on tensors that live on the engine's GPU.
//!
//! The engine works on the caller's device memory directly, with no copy
//! to the host. Safe Rust cannot rely on a handle being dropped (it may be
//! leaked), so the borrow is tied to the scope instead: [`Kolo::scope`]
//! returns only once the engine is done with every tensor submitted in
//! it — for device tensors, once the GPU is — whatever became of the
//! handles.

use super::plane::Output;
use super::tensor::{DeviceArgs, DeviceDone, OnDevice, ReadyEvents};
use crate::device_tensor::{DeviceTensor, DeviceTensorMut};
use crate::engine::submission::{Input, Inputs, Submission};
use crate::error::Error;
use crate::group::TensorGroup;
use crate::handle::Handle;
#[allow(unused_imports)] // named in the docs
use crate::kolo::Kolo;
use crate::ops::{my_rows, ReduceOptions};
use crate::placed::PlacedMut;
use crate::scope::Scope;
use crate::tensor::shape_problem;
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtrMut, DeviceSlice};
use kolo_nccl::Untracked;
use kolo_protocol::{Device, Params, RequestKind};
use kolo_transport::Element;
use std::any::TypeId;
use std::sync::Arc;

/// One tensor ready to be submitted.
struct Item<T: 'static> {
    name: String,
    params: Params,
    args: DeviceArgs<T>,
    /// The streams of its buffers (output first).
    streams: Vec<Arc<CudaStream>>,
}

impl<'scope> Scope<'scope, '_> {
    /// Submits an in-place allreduce of the device tensor `buf`. The
    /// engine's work follows everything enqueued on `buf`'s stream before
    /// the call (and `buf`'s earlier uses as cudarc tracks them). The
    /// handle completes once the GPU has written the result into `buf`,
    /// so any stream may use it after `wait` returns.
    pub(crate) fn allreduce_on_device<T: Element>(
        &self,
        name: &str,
        buf: DeviceTensorMut<'scope, T>,
        options: ReduceOptions,
    ) -> Result<Handle<'scope, ()>, Error> {
        let template = self.allreduce_template::<T>(name, options)?;
        let mut submission = Submission::new(template, 1, false, Some(self.lease()));
        self.lend(
            &mut submission,
            std::iter::once((Some(name), PlacedMut::Device(buf))),
            |_| name,
        )?;
        self.submit_lent(submission)
    }

    /// Submits the in-place allreduces of the device tensors of `group`
    /// (see [`Kolo::allreduce_group`]): one handle for them all; on an
    /// error at submission nothing is submitted.
    pub(crate) fn allreduce_group_on_device<T: Element>(
        &self,
        group: &TensorGroup,
        tensors: impl Iterator<Item = PlacedMut<'scope, T>>,
        options: ReduceOptions,
    ) -> Result<Handle<'scope, ()>, Error> {
        let template = self.allreduce_template::<T>(group.name(0), options)?;
        let mut submission = Submission::known(template, group.list(), Some(self.lease()));
        let given = self.lend(&mut submission, tensors.map(|t| (None, t)), |i| {
            group.name(i)
        })?;
        group.check_count(given)?;
        self.submit_lent(submission)
    }

    /// The parameters shared by the allreduces of one submission on the
    /// engine's GPU (`name` names the first tensor in errors).
    fn allreduce_template<T: Element>(
        &self,
        name: &str,
        options: ReduceOptions,
    ) -> Result<Params, Error> {
        let Some(gpu) = self.kolo().gpu() else {
            return Err(Error::InvalidArgument {
                tensor: name.to_owned(),
                reason: crate::engine::placement::NO_GPU_ENGINE.into(),
            });
        };
        if options.compression != kolo_protocol::Compression::None {
            return Err(Error::InvalidArgument {
                tensor: name.to_owned(),
                reason: format!(
                    "compression {} applies to host tensors: NCCL reduces device tensors as \
                     they are",
                    options.compression
                ),
            });
        }
        Ok(Params {
            device: Device::Cuda(gpu as u32),
            ..self
                .kolo()
                .reduce_params(RequestKind::Allreduce, &[], T::DTYPE, options)
        })
    }

    /// Lends `tensors` (each with its name, unless the submission's names
    /// are a group's; `name_of` names tensor i in errors) to `submission`
    /// by address, each buffer's stream made to wait (on the GPU) for its
    /// earlier uses as cudarc tracks them; then records one ready event
    /// per stream, after those waits, for the engine's stream to wait for.
    /// Returns the number of tensors.
    fn lend<'n, 'g, T: Element>(
        &self,
        submission: &mut Submission<'n>,
        tensors: impl Iterator<Item = (Option<&'n str>, PlacedMut<'scope, T>)>,
        name_of: impl Fn(usize) -> &'g str,
    ) -> Result<usize, Error> {
        submission.inputs = Inputs::on_device(TypeId::of::<OnDevice<T>>(), submission.len());
        let gpu = self.kolo().gpu();
        let mut streams: Vec<Arc<CudaStream>> = Vec::with_capacity(1);
        let mut given = 0;
        for (name, tensor) in tensors {
            let mut tensor = match tensor {
                PlacedMut::Device(tensor) => tensor,
                other => {
                    return Err(Error::InvalidArgument {
                        tensor: name_of(given).to_owned(),
                        reason: format!(
                            "the tensor is in {}, but the group's first tensor is in GPU memory",
                            other.memory()
                        ),
                    })
                }
            };
            let len = tensor.view.len();
            check_shape(name_of(given), &tensor.shape, len)?;
            let on = match streams
                .iter()
                .position(|s| Arc::ptr_eq(s, tensor.view.stream()))
            {
                Some(on) => on,
                None => {
                    let stream = tensor.view.stream();
                    self.device_of(name_of(given), stream)?;
                    streams.push(Arc::clone(stream));
                    streams.len() - 1
                }
            };
            debug_assert_eq!(gpu, Some(streams[on].context().ordinal()));
            let (ptr, guard) = tensor.view.device_ptr_mut(&streams[on]);
            // The guard would record the write now, before the engine's
            // work; the engine orders that work itself (the ready event),
            // and the scope outlives it.
            std::mem::forget(guard);
            let Some(ptr) = std::ptr::NonNull::new(ptr as usize as *mut u8) else {
                return Err(internal(name_of(given), "a device tensor at address 0"));
            };
            submission.push_device(name, &tensor.shape, ptr, len);
            given += 1;
        }
        let mut ready = ReadyEvents::default();
        for stream in &streams {
            ready.on(stream).map_err(|e| Error::Collective {
                tensor: name_of(0).to_owned(),
                message: format!("recording the ready event on the caller's stream: {e:?}"),
            })?;
        }
        submission.inputs.set_ready(Arc::new(ready));
        Ok(given)
    }

    /// Submits tensors lent by [`Scope::lend`].
    fn submit_lent(&self, submission: Submission<'_>) -> Result<Handle<'scope, ()>, Error> {
        let completion = self.kolo().submit(submission)?;
        Ok(Handle::new(completion, |_| Ok(())))
    }

    /// Submits an operation that reads the device tensor `input` and
    /// returns an output of type `O` the engine allocates on its stream:
    /// an allgather (every rank's rows in rank order, the first dimension
    /// may differ per rank; a gather of zero elements returns a buffer of
    /// one element) or an alltoall (a
    /// [`DeviceReceived`](super::DeviceReceived)).
    pub(crate) fn gather_on_device<T: Element, O: Send + 'static>(
        &self,
        name: &str,
        kind: RequestKind,
        input: DeviceTensor<'scope, T>,
        splits: &[usize],
    ) -> Result<Handle<'scope, O>, Error> {
        let tensor = name.to_owned();
        self.gather_on_device_with(name, kind, input, splits, move |(output, _)| {
            output
                .downcast::<O>()
                .map(|o| *o)
                .map_err(|_| internal(&tensor, "the engine's output has another type"))
        })
    }

    /// [`Scope::gather_on_device`] whose handle turns the engine's output
    /// and its shape into the result with `finish`.
    pub(crate) fn gather_on_device_with<T: Element, O>(
        &self,
        name: &str,
        kind: RequestKind,
        input: DeviceTensor<'scope, T>,
        splits: &[usize],
        finish: impl FnOnce(Output) -> Result<O, Error> + Send + 'scope,
    ) -> Result<Handle<'scope, O>, Error> {
        check_shape(name, &input.shape, input.view.len())?;
        let params = Params {
            device: self.device_of(name, input.view.stream())?,
            splits: splits.iter().map(|&s| s as u64).collect(),
            ..self.kolo().params(kind, T::DTYPE, &input.shape)
        };
        let item = self.item(name, params, Some(input.view), None)?;
        let tensor = name.to_owned();
        self.submit_items(vec![item], move |mut outputs| {
            let output = outputs
                .pop()
                .flatten()
                .ok_or_else(|| internal(&tensor, "the engine's output is missing"))?;
            finish(output)
        })
    }

    /// Submits a broadcast of the root's device tensor into every rank's
    /// `buf`.
    pub(crate) fn broadcast_on_device<T: Element>(
        &self,
        name: &str,
        buf: DeviceTensorMut<'scope, T>,
        root_rank: u32,
    ) -> Result<Handle<'scope, ()>, Error> {
        check_shape(name, &buf.shape, buf.view.len())?;
        let params = Params {
            root_rank,
            ..self.params::<T>(
                name,
                RequestKind::Broadcast,
                &buf.shape,
                buf.view.stream(),
                ReduceOptions::default(),
            )?
        };
        let item = self.item(name, params, None, Some(buf.view))?;
        self.submit_items(vec![item], |_| Ok(()))
    }

    /// Submits a reduce-scatter: `input` is reduced across all ranks and
    /// this rank's share of its first dimension lands in `output`.
    pub(crate) fn reduce_scatter_on_device<T: Element>(
        &self,
        name: &str,
        input: DeviceTensor<'scope, T>,
        output: DeviceTensorMut<'scope, T>,
        options: ReduceOptions,
    ) -> Result<Handle<'scope, ()>, Error> {
        check_shape(name, &input.shape, input.view.len())?;
        my_rows(self.kolo(), name, &input.shape, output.view.len())?;
        // Both buffers must live on the engine's GPU: a rank failing to
        // enqueue would leave its peers waiting in NCCL.
        self.device_of(name, input.view.stream())?;
        let params = self.params::<T>(
            name,
            RequestKind::ReduceScatter,
            &input.shape,
            output.view.stream(),
            options,
        )?;
        let item = self.item(name, params, Some(input.view), Some(output.view))?;
        self.submit_items(vec![item], |_| Ok(()))
    }

    /// The parameters of a tensor of `shape` on `stream` (which must be on
    /// the engine's GPU) with the reduction `options`.
    fn params<T: Element>(
        &self,
        name: &str,
        kind: RequestKind,
        shape: &[usize],
        stream: &Arc<CudaStream>,
        options: ReduceOptions,
    ) -> Result<Params, Error> {
        Ok(Params {
            device: self.device_of(name, stream)?,
            ..self.kolo().reduce_params(kind, shape, T::DTYPE, options)
        })
    }

    /// The device of a tensor on `stream`, which must be the engine's GPU.
    fn device_of(&self, name: &str, stream: &Arc<CudaStream>) -> Result<Device, Error> {
        let ordinal = stream.context().ordinal();
        match self.kolo().gpu() {
            Some(gpu) if gpu == ordinal => Ok(Device::Cuda(ordinal as u32)),
            Some(gpu) => Err(Error::InvalidArgument {
                tensor: name.to_owned(),
                reason: format!(
                    "the tensor lives on cuda:{ordinal}, but rank {} reduces on cuda:{gpu}",
                    self.kolo().rank()
                ),
            }),
            None => Err(Error::InvalidArgument {
                tensor: name.to_owned(),
                reason: crate::engine::placement::NO_GPU_ENGINE.into(),
            }),
        }
    }

    /// One tensor's engine arguments: its addresses, each buffer's stream
    /// made to wait (on the GPU) for the buffer's earlier uses as cudarc
    /// tracks them, and a lease on the memory. The ready events come in
    /// [`Scope::submit`], after every tensor's waits.
    fn item<T: Element>(
        &self,
        name: &str,
        params: Params,
        input: Option<CudaView<'scope, T>>,
        mut output: Option<CudaViewMut<'scope, T>>,
    ) -> Result<Item<T>, Error> {
        let streams: Vec<Arc<CudaStream>> = output
            .as_ref()
            .map(|v| Arc::clone(v.stream()))
            .into_iter()
            .chain(input.as_ref().map(|v| Arc::clone(v.stream())))
            .collect();
        if streams.is_empty() {
            return Err(internal(name, "a device op without a buffer"));
        }
        // SAFETY: the memory stays borrowed for 'scope, and the engine uses
        // these addresses only until it drops the `DeviceArgs` below, which
        // releases the lease taken here; `Kolo::scope` does not
        // return before every lease of the scope is released — after the
        // GPU work completed, or, on failure, after the views' events were
        // recorded behind it (`DeviceArgs::fence`). The engine's stream
        // waits for the ready event recorded on each buffer's stream after
        // these waits, so the work follows the buffers' earlier uses; the
        // borrow keeps the caller from using them meanwhile.
        let (read, write) = unsafe {
            (
                input.as_ref().map(|v| Untracked::read_after(v, v.stream())),
                output.as_mut().map(|v| {
                    let stream = Arc::clone(v.stream());
                    Untracked::write_after(v, &stream)
                }),
            )
        };
        // SAFETY: only the lifetime changes. The views are used by the
        // engine until it drops these `DeviceArgs`, which releases the
        // lease taken here; `Kolo::scope` does not return before
        // every lease of the scope is released, and the memory is borrowed
        // for `'scope`, which outlasts that call. So the views are never
        // used after the borrow ends, whatever happens to the handles.
        let (input, output) = unsafe {
            (
                input.map(|v| std::mem::transmute::<CudaView<'scope, T>, CudaView<'static, T>>(v)),
                output.map(|v| {
                    std::mem::transmute::<CudaViewMut<'scope, T>, CudaViewMut<'static, T>>(v)
                }),
            )
        };
        Ok(Item {
            name: name.to_owned(),
            params,
            args: DeviceArgs {
                input,
                output,
                read,
                write,
                ready: Vec::new(),
                _lease: self.lease(),
            },
            streams,
        })
    }

    /// Submits `items` together, after recording one ready event on each
    /// of their streams (the waits of every item come first, so one event
    /// per stream covers them all); the handle turns the engine's outputs
    /// (in the order of `items`) into the result with `finish`.
    fn submit_items<T: Element, O>(
        &self,
        items: Vec<Item<T>>,
        finish: impl FnOnce(Vec<Option<Output>>) -> Result<O, Error> + Send + 'scope,
    ) -> Result<Handle<'scope, O>, Error> {
        let mut ready = ReadyEvents::default();
        let names: Vec<String> = items.iter().map(|item| item.name.clone()).collect();
        let Some(template) = items.first().map(|item| item.params.clone()) else {
            return Err(internal("", "a device submission without tensors"));
        };
        if let Some(odd) = items.iter().find(|item| {
            !item
                .params
                .same_as_with_shape(&template, &item.params.shape)
        }) {
            return Err(internal(
                &odd.name,
                "the tensors of one submission differ in more than shape",
            ));
        }
        let mut group = Submission::new(template, items.len(), true, None);
        for (mut item, name) in items.into_iter().zip(&names) {
            for stream in &item.streams {
                let event = ready.on(stream).map_err(|e| Error::Collective {
                    tensor: name.clone(),
                    message: format!("recording the ready event on the caller's stream: {e:?}"),
                })?;
                if !item.args.ready.iter().any(|e| Arc::ptr_eq(e, &event)) {
                    item.args.ready.push(event);
                }
            }
            let shape = item.params.shape.clone();
            group.push(name, &shape, Input::Owned(Box::new(item.args)));
        }
        let completion = self.kolo().submit(group)?;
        Ok(Handle::new(completion, move |payloads| {
            let mut outputs = Vec::with_capacity(payloads.len());
            for (tensor, payload) in names.iter().zip(payloads) {
                let done = payload
                    .downcast::<DeviceDone>()
                    .map_err(|_| internal(tensor, "the engine returned a host result"))?;
                outputs.push(done.output);
            }
            finish(outputs)
        }))
    }
}

/// Fails unless `shape` holds `len` elements.
fn check_shape(name: &str, shape: &[usize], len: usize) -> Result<(), Error> {
    match shape_problem(shape, len) {
        None => Ok(()),
        Some(reason) => Err(Error::InvalidArgument {
            tensor: name.to_owned(),
            reason,
        }),
    }
}

/// An internal inconsistency about `tensor`.
fn internal(tensor: &str, what: &str) -> Error {
    Error::Collective {
        tensor: tensor.to_owned(),
        message: format!("internal: {what}"),
    }
}
