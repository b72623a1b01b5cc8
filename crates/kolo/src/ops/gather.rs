//! Allgather, broadcast and alltoall: blocking on [`Kolo`], asynchronous
//! in a [`Scope`].

use super::{check, output, write_back};
use crate::engine::submission::Input;
use crate::error::Error;
use crate::handle::Handle;
use crate::kolo::Kolo;
use crate::placed::{IntoTensor, IntoTensorMut, Placed, PlacedMut, Received};
use crate::scope::Scope;
use crate::tensor::shape_problem;
use kolo_protocol::{Params, RequestKind};
use kolo_transport::Element;

impl Kolo {
    /// Concatenates every rank's `input` along the first dimension, in rank
    /// order (blocking). The first dimension may differ per rank; the
    /// others must agree. A host `input` (`&[T]`, `&Vec<T>`, a
    /// [`Tensor`](crate::Tensor)) gathers into a `Vec<T>`; a tensor of the
    /// engine's GPU into a `CudaSlice<T>` the engine allocates there (see
    /// [`IntoTensor`]).
    pub fn allgather<'i, I: IntoTensor<'i>>(
        &self,
        name: &str,
        input: I,
    ) -> Result<I::Gathered, Error> {
        let input = input.placed();
        self.blocking_scope(|s| {
            s.gather_placed(name, RequestKind::Allgather, input.shorten(), &[])?
                .wait()
        })
    }

    /// Copies the root's `buf` into every rank's `buf` (blocking; host or
    /// GPU memory, as [`Kolo::allreduce`] takes it).
    pub fn broadcast<'t>(
        &self,
        name: &str,
        buf: impl IntoTensorMut<'t>,
        root: usize,
    ) -> Result<(), Error> {
        let buf = buf.placed();
        self.blocking_scope(|s| s.broadcast_placed(name, buf.shorten(), root)?.wait())
    }

    /// Sends `splits[p]` rows of `send` (first dimension, in order) to each
    /// rank p and returns the rows every rank sent here, in rank order,
    /// with their counts (blocking). Empty `splits` split the rows evenly.
    /// A host `send` receives a [`Received<T>`]; a tensor of the engine's
    /// GPU a `DeviceReceived<T>` on that GPU.
    pub fn alltoall<'i, I: IntoTensor<'i>>(
        &self,
        name: &str,
        send: I,
        splits: &[usize],
    ) -> Result<I::Received, Error> {
        let send = send.placed();
        self.blocking_scope(|s| {
            s.gather_placed(name, RequestKind::Alltoall, send.shorten(), splits)?
                .wait()
        })
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Submits an allgather of `input` (see [`Kolo::allgather`]); a host
    /// `input` is copied at submission. The handle returns the gathered
    /// rows.
    pub fn allgather_async<I: IntoTensor<'scope>>(
        &self,
        name: &str,
        input: I,
    ) -> Result<Handle<'scope, I::Gathered>, Error> {
        self.gather_placed(name, RequestKind::Allgather, input.placed(), &[])
    }

    /// Submits a broadcast of the root's `buf` into every rank's `buf`
    /// (see [`Kolo::broadcast`]); `buf` holds the result once the handle
    /// completed.
    pub fn broadcast_async(
        &self,
        name: &str,
        buf: impl IntoTensorMut<'scope>,
        root: usize,
    ) -> Result<Handle<'scope, ()>, Error> {
        self.broadcast_placed(name, buf.placed(), root)
    }

    /// Submits an alltoall of `send` (see [`Kolo::alltoall`]); a host
    /// `send` is copied at submission. The handle returns what arrived.
    pub fn alltoall_async<I: IntoTensor<'scope>>(
        &self,
        name: &str,
        send: I,
        splits: &[usize],
    ) -> Result<Handle<'scope, I::Received>, Error> {
        self.gather_placed(name, RequestKind::Alltoall, send.placed(), splits)
    }

    /// Submits an allgather or an alltoall (`kind`; `splits` for the
    /// alltoall) of `input`, whose handle returns an output of type `O`
    /// (which the input's memory decides).
    pub(crate) fn gather_placed<T: Element, O: Send + 'static>(
        &self,
        name: &str,
        kind: RequestKind,
        input: Placed<'scope, T>,
        splits: &[usize],
    ) -> Result<Handle<'scope, O>, Error> {
        // Without the `nccl` feature, host memory is the only kind.
        #[cfg_attr(not(feature = "nccl"), allow(clippy::infallible_destructuring_match))]
        let input = match input {
            Placed::Host(input) => input,
            #[cfg(feature = "nccl")]
            Placed::Device(input) => return self.gather_on_device(name, kind, input, splits),
        };
        check(name, input.problem())?;
        let params = Params {
            splits: splits.iter().map(|&s| s as u64).collect(),
            ..self.kolo().params(kind, T::DTYPE, input.shape())
        };
        let completion =
            self.submit_one(name, params, Input::Owned(Box::new(input.data().to_vec())))?;
        let tensor = name.to_owned();
        Ok(Handle::new(completion, move |mut payloads| {
            let payload = payloads.pop();
            if kind != RequestKind::Alltoall {
                return output(&tensor, payload);
            }
            let (data, splits): (Vec<T>, Vec<usize>) = output(&tensor, payload)?;
            output(&tensor, Some(Box::new(Received { data, splits })))
        }))
    }

    /// [`Scope::broadcast_async`] of a tensor already placed.
    pub(crate) fn broadcast_placed<T: Element>(
        &self,
        name: &str,
        buf: PlacedMut<'scope, T>,
        root: usize,
    ) -> Result<Handle<'scope, ()>, Error> {
        let root_rank = u32::try_from(root).map_err(|_| Error::InvalidArgument {
            tensor: name.to_owned(),
            reason: format!("root rank {root} is out of range"),
        })?;
        let (data, shape) = match buf {
            PlacedMut::Host(buf) => buf.into_parts(),
            #[cfg(feature = "nccl")]
            PlacedMut::Device(buf) => return self.broadcast_on_device(name, buf, root_rank),
        };
        check(name, shape_problem(&shape, data.len()))?;
        let params = Params {
            root_rank,
            ..self.kolo().params(RequestKind::Broadcast, T::DTYPE, &shape)
        };
        let completion = self.submit_one(name, params, Input::Owned(Box::new(data.to_vec())))?;
        let tensor = name.to_owned();
        Ok(Handle::new(completion, move |mut payloads| {
            let result: Vec<T> = output(&tensor, payloads.pop())?;
            write_back(&tensor, data, &result)
        }))
    }
}
