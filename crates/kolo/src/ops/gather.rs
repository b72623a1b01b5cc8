//! Allgather, broadcast and alltoall: blocking on [`Kolo`], asynchronous
//! in a [`Scope`].

use super::{check, output, write_back};
use crate::engine::submission::Input;
use crate::error::Error;
use crate::handle::Handle;
use crate::kolo::Kolo;
use crate::scope::Scope;
use crate::tensor::{shape_problem, Tensor, TensorMut};
use kolo_protocol::{Params, RequestKind};
use kolo_transport::Element;

/// What an alltoall delivered to this rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Received<T> {
    /// Every peer's rows for this rank, in peer order.
    pub data: Vec<T>,
    /// How many rows came from each peer, in peer order.
    pub splits: Vec<usize>,
}

impl Kolo {
    /// Concatenates every rank's `input` along the first dimension, in rank
    /// order (blocking). The first dimension may differ per rank; the
    /// others must agree.
    pub fn allgather<'i, T: Element>(
        &self,
        name: &str,
        input: impl Into<Tensor<'i, T>>,
    ) -> Result<Vec<T>, Error> {
        let input = input.into();
        self.blocking_scope(|s| s.allgather_async(name, input)?.wait())
    }

    /// Copies the root's `buf` into every rank's `buf` (blocking).
    pub fn broadcast<'t, T: Element>(
        &self,
        name: &str,
        buf: impl Into<TensorMut<'t, T>>,
        root: usize,
    ) -> Result<(), Error> {
        let buf = buf.into();
        self.blocking_scope(|s| s.broadcast_async(name, buf, root)?.wait())
    }

    /// Sends `splits[p]` rows of `send` (first dimension, in order) to each
    /// rank p and returns the rows every rank sent here, in rank order,
    /// with their counts (blocking). Empty `splits` split the rows evenly.
    pub fn alltoall<'i, T: Element>(
        &self,
        name: &str,
        send: impl Into<Tensor<'i, T>>,
        splits: &[usize],
    ) -> Result<Received<T>, Error> {
        let send = send.into();
        self.blocking_scope(|s| s.alltoall_async(name, send, splits)?.wait())
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Submits an allgather of `input` (see [`Kolo::allgather`]); `input`
    /// is copied at submission, and the handle returns the gathered rows.
    pub fn allgather_async<'i, T: Element>(
        &self,
        name: &str,
        input: impl Into<Tensor<'i, T>>,
    ) -> Result<Handle<'scope, Vec<T>>, Error> {
        let input = input.into();
        check(name, input.problem())?;
        let params = self
            .kolo()
            .params(RequestKind::Allgather, T::DTYPE, input.shape());
        let completion =
            self.submit_one(name, params, Input::Owned(Box::new(input.data().to_vec())))?;
        let tensor = name.to_owned();
        Ok(Handle::new(completion, move |mut payloads| {
            output(&tensor, payloads.pop())
        }))
    }

    /// Submits a broadcast of the root's `buf` into every rank's `buf`
    /// (see [`Kolo::broadcast`]); the handle writes `buf` when it
    /// completes.
    pub fn broadcast_async<T: Element>(
        &self,
        name: &str,
        buf: impl Into<TensorMut<'scope, T>>,
        root: usize,
    ) -> Result<Handle<'scope, ()>, Error> {
        let (data, shape) = buf.into().into_parts();
        check(name, shape_problem(&shape, data.len()))?;
        let root_rank = u32::try_from(root).map_err(|_| Error::InvalidArgument {
            tensor: name.to_owned(),
            reason: format!("root rank {root} is out of range"),
        })?;
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

    /// Submits an alltoall of `send` (see [`Kolo::alltoall`]); `send` is
    /// copied at submission, and the handle returns what arrived.
    pub fn alltoall_async<'i, T: Element>(
        &self,
        name: &str,
        send: impl Into<Tensor<'i, T>>,
        splits: &[usize],
    ) -> Result<Handle<'scope, Received<T>>, Error> {
        let send = send.into();
        check(name, send.problem())?;
        let params = Params {
            splits: splits.iter().map(|&s| s as u64).collect(),
            ..self
                .kolo()
                .params(RequestKind::Alltoall, T::DTYPE, send.shape())
        };
        let completion =
            self.submit_one(name, params, Input::Owned(Box::new(send.data().to_vec())))?;
        let tensor = name.to_owned();
        Ok(Handle::new(completion, move |mut payloads| {
            let (data, splits): (Vec<T>, Vec<usize>) = output(&tensor, payloads.pop())?;
            Ok(Received { data, splits })
        }))
    }
}
