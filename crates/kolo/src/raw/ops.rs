//! The collectives on [`RawTensor`]s: each picks the element type from the
//! tensor's data type and its path from its memory, then submits through
//! the same calls as the typed API (in a scope nobody waits for: the
//! caller vouches for the memory until the handle completed). Host
//! allreduces work on the caller's memory in place; device tensors go
//! through the GPU engine on the caller's stream.

use super::handle::{Keep, RawHandle, RawOutput};
use super::tensor::{RawMemory, RawTensor};
use crate::error::Error;
use crate::group::TensorGroup;
use crate::handle::Handle;
use crate::kolo::Kolo;
use crate::ops::ReduceOptions;
use crate::placed::{Placed, PlacedMut, Received};
use crate::tensor::{Tensor, TensorMut};
use half::{bf16, f16};
use kolo_protocol::{DataType, RequestKind};
use kolo_transport::Element;

/// Runs `$body` with `$t` the element type of the data type `$dtype`.
macro_rules! with_element {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DataType::U8 => {
                type $t = u8;
                $body
            }
            DataType::I8 => {
                type $t = i8;
                $body
            }
            DataType::U16 => {
                type $t = u16;
                $body
            }
            DataType::I16 => {
                type $t = i16;
                $body
            }
            DataType::I32 => {
                type $t = i32;
                $body
            }
            DataType::I64 => {
                type $t = i64;
                $body
            }
            DataType::F16 => {
                type $t = f16;
                $body
            }
            DataType::BF16 => {
                type $t = bf16;
                $body
            }
            DataType::F32 => {
                type $t = f32;
                $body
            }
            DataType::F64 => {
                type $t = f64;
                $body
            }
            DataType::Bool => {
                type $t = bool;
                $body
            }
        }
    };
}

/// A handle borrowing nothing but memory the caller vouches for.
///
/// # Safety
/// Every borrow `handle` holds was made from [`RawTensor`]s whose memory
/// the caller keeps valid, and untouched, until the operation completed
/// (the contract of the `*_raw` calls). A handle's finishing step
/// borrows only its submission's buffers, never the engine or the scope.
pub(crate) unsafe fn unbind<O>(handle: Handle<'_, O>) -> Handle<'static, O> {
    // SAFETY: only the lifetime changes; the caller's contract makes the
    // borrowed memory outlive the handle's use of it.
    unsafe { std::mem::transmute::<Handle<'_, O>, Handle<'static, O>>(handle) }
}

/// A raw handle over `handle`, which writes in place (no output).
fn in_place(handle: Handle<'static, ()>, keep: Vec<Keep>) -> RawHandle {
    RawHandle {
        handle: handle.map(|()| None),
        keep,
    }
}

/// Fails unless `tensor` is the same data type and memory as `first`, the
/// first tensor of its call.
fn same_kind(name: &str, tensor: &RawTensor, first: &RawTensor, what: &str) -> Result<(), Error> {
    let problem = if tensor.dtype() != first.dtype() {
        format!(
            "it is {}, but the {what} is {}",
            tensor.dtype().name(),
            first.dtype().name()
        )
    } else if tensor.memory() != first.memory() {
        format!(
            "it is in {}, but the {what} is in {}",
            memory_name(tensor.memory()),
            memory_name(first.memory())
        )
    } else {
        return Ok(());
    };
    Err(Error::InvalidArgument {
        tensor: name.to_owned(),
        reason: problem,
    })
}

/// A memory's name in errors.
fn memory_name(memory: RawMemory) -> String {
    match memory {
        RawMemory::Host => "host memory".into(),
        RawMemory::Cuda { device, .. } => format!("the memory of cuda:{device}"),
    }
}

/// The shape of `elements` elements gathered from tensors shaped like
/// `input` (rows of `input.shape()[1..]`).
fn gathered_shape(input: &[usize], elements: usize) -> Vec<usize> {
    let row: usize = input.iter().skip(1).product();
    let mut shape = vec![elements.checked_div(row).unwrap_or(0)];
    shape.extend_from_slice(input.get(1..).unwrap_or(&[]));
    shape
}

/// Safety contract shared by every call below.
///
/// Each `*_raw` call is `unsafe`: the caller vouches that every tensor's
/// memory is valid for reads (inputs) and writes (outputs and in-place
/// buffers) of its `byte_len()` bytes, holds values of its data type (a
/// host bool tensor is checked: 0 or 1), lives where its
/// [`RawMemory`] says, and is neither freed nor touched by anything else
/// until the returned handle reported completion (by `wait`, `poll` or
/// its callback) — also if the handle is dropped before.
impl Kolo {
    /// Reduces `tensor` across all ranks in place, as
    /// [`Kolo::allreduce`] does (host memory with no copy; a CUDA tensor
    /// through the GPU engine, after its stream's earlier work).
    ///
    /// # Safety
    /// See the contract above: `tensor` is read and written until the
    /// handle completed.
    pub unsafe fn allreduce_raw(
        &self,
        name: &str,
        tensor: &RawTensor,
        options: impl Into<ReduceOptions>,
    ) -> Result<RawHandle, Error> {
        let options = options.into();
        with_element!(tensor.dtype(), T => {
            // SAFETY: the caller's contract.
            let Place { tensor, keep } = unsafe { self.place_mut::<T>(name, tensor)? };
            let scope = self.detached_scope();
            let handle = scope.allreduce_placed(name, tensor, options)?;
            // SAFETY: the handle borrows `tensor`'s memory only.
            Ok(in_place(unsafe { unbind(handle) }, keep))
        })
    }

    /// Allreduces the tensors of `group` together (see
    /// [`Kolo::allreduce_group`]): `tensors` in the group's order, all of
    /// one data type and memory.
    ///
    /// # Safety
    /// See the contract above, for every tensor.
    pub unsafe fn allreduce_group_raw(
        &self,
        group: &TensorGroup,
        tensors: &[RawTensor],
        options: impl Into<ReduceOptions>,
    ) -> Result<RawHandle, Error> {
        let options = options.into();
        let Some(first) = tensors.first() else {
            group.check_count(0)?;
            return Ok(RawHandle {
                handle: Handle::done(None),
                keep: Vec::new(),
            });
        };
        for (i, tensor) in tensors.iter().enumerate() {
            same_kind(group.name(i), tensor, first, "group's first tensor")?;
        }
        with_element!(first.dtype(), T => {
            let mut placed = Vec::with_capacity(tensors.len());
            let mut keep = Vec::new();
            for (i, tensor) in tensors.iter().enumerate() {
                // SAFETY: the caller's contract.
                let place = unsafe { self.place_mut::<T>(group.name(i), tensor)? };
                placed.push(place.tensor);
                keep.extend(place.keep);
            }
            let scope = self.detached_scope();
            let handle = scope.allreduce_group_placed(group, placed.into_iter(), options)?;
            // SAFETY: the handle borrows the tensors' memory only.
            Ok(in_place(unsafe { unbind(handle) }, keep))
        })
    }

    /// Copies the root's `tensor` into every rank's `tensor` (see
    /// [`Kolo::broadcast`]).
    ///
    /// # Safety
    /// See the contract above: `tensor` is read and written until the
    /// handle completed.
    pub unsafe fn broadcast_raw(
        &self,
        name: &str,
        tensor: &RawTensor,
        root: usize,
    ) -> Result<RawHandle, Error> {
        with_element!(tensor.dtype(), T => {
            // SAFETY: the caller's contract.
            let Place { tensor, keep } = unsafe { self.place_mut::<T>(name, tensor)? };
            let scope = self.detached_scope();
            let handle = scope.broadcast_placed(name, tensor, root)?;
            // SAFETY: the handle borrows `tensor`'s memory only.
            Ok(in_place(unsafe { unbind(handle) }, keep))
        })
    }

    /// Reduces `input` across all ranks and leaves this rank's rows in
    /// `output` (see [`Kolo::reduce_scatter`]); both of one data type and
    /// memory.
    ///
    /// # Safety
    /// See the contract above: `input` is read and `output` written until
    /// the handle completed.
    pub unsafe fn reduce_scatter_raw(
        &self,
        name: &str,
        input: &RawTensor,
        output: &RawTensor,
        options: impl Into<ReduceOptions>,
    ) -> Result<RawHandle, Error> {
        let options = options.into();
        same_kind(name, output, input, "input")?;
        with_element!(input.dtype(), T => {
            // SAFETY: the caller's contract.
            let (from, into) = unsafe {
                (self.place::<T>(name, input)?, self.place_mut::<T>(name, output)?)
            };
            let scope = self.detached_scope();
            let handle = scope.reduce_scatter_placed(name, from.tensor, into.tensor, options)?;
            let keep = from.keep.into_iter().chain(into.keep).collect();
            // SAFETY: the handle borrows the two tensors' memory only.
            Ok(in_place(unsafe { unbind(handle) }, keep))
        })
    }

    /// Concatenates every rank's `input` along the first dimension (see
    /// [`Kolo::allgather`]); the handle's output holds the result, in the
    /// input's memory.
    ///
    /// # Safety
    /// See the contract above: `input` is read until the handle completed.
    pub unsafe fn allgather_raw(&self, name: &str, input: &RawTensor) -> Result<RawHandle, Error> {
        // SAFETY: the caller's contract.
        unsafe { self.gather_raw(name, RequestKind::Allgather, input, &[]) }
    }

    /// Sends `splits[p]` rows of `input` to each rank p (see
    /// [`Kolo::alltoall`]); the handle's output holds what arrived and the
    /// rows from each rank.
    ///
    /// # Safety
    /// See the contract above: `input` is read until the handle completed.
    pub unsafe fn alltoall_raw(
        &self,
        name: &str,
        input: &RawTensor,
        splits: &[usize],
    ) -> Result<RawHandle, Error> {
        // SAFETY: the caller's contract.
        unsafe { self.gather_raw(name, RequestKind::Alltoall, input, splits) }
    }

    /// An allgather or an alltoall (`kind`) of `input`.
    ///
    /// # Safety
    /// As [`Kolo::allgather_raw`].
    unsafe fn gather_raw(
        &self,
        name: &str,
        kind: RequestKind,
        input: &RawTensor,
        splits: &[usize],
    ) -> Result<RawHandle, Error> {
        let dims = input.shape().to_vec();
        with_element!(input.dtype(), T => {
            // SAFETY: the caller's contract.
            let Place { tensor, keep } = unsafe { self.place::<T>(name, input)? };
            let scope = self.detached_scope();
            let handle = match tensor {
                Placed::Host(tensor) => {
                    let host = Placed::Host(tensor);
                    if kind == RequestKind::Allgather {
                        let h = scope.gather_placed::<T, Vec<T>>(name, kind, host, splits)?;
                        h.map(move |data: Vec<T>| {
                            let shape = gathered_shape(&dims, data.len());
                            Some(RawOutput::host(data, shape, Vec::new()))
                        })
                    } else {
                        let h = scope.gather_placed::<T, Received<T>>(name, kind, host, splits)?;
                        h.map(move |got: Received<T>| {
                            let shape = gathered_shape(&dims, got.data.len());
                            Some(RawOutput::host(got.data, shape, got.splits))
                        })
                    }
                }
                #[cfg(feature = "nccl")]
                device => super::device::gather(&scope, name, kind, device, splits)?,
            };
            // SAFETY: the handle borrows `input`'s memory only.
            Ok(RawHandle { handle: unsafe { unbind(handle) }, keep })
        })
    }

    /// `tensor` as a writable tensor of `T` in its memory.
    ///
    /// # Safety
    /// The contract above, for `'static` (until the operation completed).
    unsafe fn place_mut<T: Element>(
        &self,
        name: &str,
        tensor: &RawTensor,
    ) -> Result<Place<PlacedMut<'static, T>>, Error> {
        match tensor.memory() {
            RawMemory::Host => {
                // SAFETY: host memory of `byte_len()` bytes (the contract).
                unsafe { tensor.check_bools(name)? };
                // SAFETY: valid `T`s (checked for bools), exclusively the
                // engine's until the operation completed (the contract).
                let data = unsafe { tensor.host_slice::<T>() };
                Ok(Place::new(PlacedMut::Host(TensorMut::with_shape(
                    data,
                    tensor.shape(),
                ))))
            }
            #[cfg(feature = "nccl")]
            RawMemory::Cuda { .. } => {
                // SAFETY: the caller's contract.
                unsafe { super::device::place_mut(self, name, tensor) }
            }
            #[cfg(not(feature = "nccl"))]
            RawMemory::Cuda { .. } => Err(no_device(name)),
        }
    }

    /// `tensor` as a read-only tensor of `T` in its memory.
    ///
    /// # Safety
    /// As [`Kolo::place_mut`], for reads.
    unsafe fn place<T: Element>(
        &self,
        name: &str,
        tensor: &RawTensor,
    ) -> Result<Place<Placed<'static, T>>, Error> {
        match tensor.memory() {
            RawMemory::Host => {
                // SAFETY: as in `place_mut`; only read.
                unsafe { tensor.check_bools(name)? };
                // SAFETY: as in `place_mut`.
                let data: &[T] = unsafe { tensor.host_slice::<T>() };
                Ok(Place::new(Placed::Host(Tensor::with_shape(
                    data,
                    tensor.shape(),
                ))))
            }
            #[cfg(feature = "nccl")]
            RawMemory::Cuda { .. } => {
                // SAFETY: the caller's contract.
                unsafe { super::device::place(self, name, tensor) }
            }
            #[cfg(not(feature = "nccl"))]
            RawMemory::Cuda { .. } => Err(no_device(name)),
        }
    }
}

/// The error of a CUDA tensor where kolo was built without the GPU engine.
#[cfg(not(feature = "nccl"))]
fn no_device(name: &str) -> Error {
    Error::InvalidArgument {
        tensor: name.to_owned(),
        reason: "a CUDA tensor, but kolo was built without the `nccl` feature (no GPU engine)"
            .into(),
    }
}

/// A raw tensor placed for the typed calls, and what must outlive its
/// operation (device tensors: the wrappers the views borrow).
pub(crate) struct Place<P> {
    pub(crate) tensor: P,
    pub(crate) keep: Vec<Keep>,
}

impl<P> Place<P> {
    /// A tensor that needs nothing kept.
    pub(crate) fn new(tensor: P) -> Self {
        Place {
            tensor,
            keep: Vec::new(),
        }
    }
}
