//! Allreduce (single, owned, grouped) and reduce-scatter.

use super::{check, output, write_back, ReduceOptions};
use crate::engine::submission::Input;
use crate::engine::submission::Submission;
use crate::error::Error;
use crate::group::TensorGroup;
use crate::handle::Handle;
use crate::kolo::Kolo;
use crate::split::split_rows;
use crate::tensor::{shape_problem, wire_shape, Dims, Tensor, TensorMut};
use kolo_protocol::{DataType, Params, RequestKind};
use kolo_transport::Element;

impl Kolo {
    /// Reduces `buf` across all ranks, in place (blocking, no copy: see
    /// [`Kolo::grouped_allreduce`] for what an error leaves in `buf`).
    /// `options` is a [`kolo_protocol::ReduceOp`] or [`ReduceOptions`] with
    /// scale factors.
    pub fn allreduce<'t, T: Element>(
        &self,
        name: &str,
        buf: impl Into<TensorMut<'t, T>>,
        options: impl Into<ReduceOptions>,
    ) -> Result<(), Error> {
        // Blocking: the engine reduces `buf` in place, without a copy.
        let (buf, options) = (buf.into(), options.into());
        self.blocking_scope(|s| s.allreduce_async(name, buf, options)?.wait())
    }

    /// Submits an allreduce of `buf`; the handle writes the result into
    /// `buf` when waited on (`buf` stays borrowed until then).
    pub fn allreduce_async<'t, T: Element>(
        &self,
        name: &str,
        buf: impl Into<TensorMut<'t, T>>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'t, ()>, Error> {
        let (data, shape) = buf.into().into_parts();
        check(name, shape_problem(&shape, data.len()))?;
        let params = self.reduce_params(RequestKind::Allreduce, &shape, T::DTYPE, options.into());
        let completion = self.submit_one(name, params, Input::Owned(Box::new(data.to_vec())))?;
        let tensor = name.to_owned();
        Ok(Handle::new(completion, move |mut payloads| {
            let result: Vec<T> = output(&tensor, payloads.pop())?;
            write_back(&tensor, data, &result)
        }))
    }

    /// Reduces a 1-D `data` across all ranks and returns it (blocking),
    /// without copying it in or out of the engine.
    pub fn allreduce_owned<T: Element>(
        &self,
        name: &str,
        data: Vec<T>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Vec<T>, Error> {
        self.allreduce_owned_async(name, data, options)?.wait()
    }

    /// [`Kolo::allreduce_owned`] without blocking: the engine takes `data`
    /// and the handle hands it back reduced.
    pub fn allreduce_owned_async<T: Element>(
        &self,
        name: &str,
        data: Vec<T>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'static, Vec<T>>, Error> {
        let shape = [data.len()];
        let params = self.reduce_params(RequestKind::Allreduce, &shape, T::DTYPE, options.into());
        let completion = self.submit_one(name, params, Input::Owned(Box::new(data)))?;
        let tensor = name.to_owned();
        Ok(Handle::new(completion, move |mut payloads| {
            output(&tensor, payloads.pop())
        }))
    }

    /// Allreduces several tensors submitted together (blocking): they reach
    /// the coordinator in the same cycle and fuse as far as the fusion
    /// threshold allows. No copy: the engine works on the buffers in place
    /// (in a [`Kolo::scope`]).
    ///
    /// Errors follow one rule for every call that submits several tensors
    /// (grouped, [`TensorGroup`], scoped or not, blocking or not): a tensor
    /// that negotiation refuses (the ranks disagree on it) is left as the
    /// caller passed it, the other tensors of the call are reduced (every
    /// rank reduced them), and the call fails with the refused tensor's
    /// error (the first one's, in the call's order, if several were
    /// refused). After a failure of the backend mid-collective (a peer
    /// died) the contents of the tensors it was reducing are unspecified,
    /// as with MPI or NCCL.
    pub fn grouped_allreduce<T: Element>(
        &self,
        tensors: &mut [(&str, &mut [T])],
        options: impl Into<ReduceOptions>,
    ) -> Result<(), Error> {
        // Blocking: the engine reduces the buffers in place, without a copy.
        let options = options.into();
        self.blocking_scope(|s| {
            let views = tensors
                .iter_mut()
                .map(|(name, buf)| (*name, TensorMut::from(&mut **buf)));
            s.grouped_allreduce_async(views, options)?.wait()
        })
    }

    /// Allreduces the tensors of `group` (blocking, in place, no copy):
    /// `tensors` holds one buffer per tensor, in the group's order. As
    /// [`Kolo::grouped_allreduce`], but the engine recognises the group by
    /// the [`TensorGroup`] alone: see [`crate::Scope::allreduce_group_async`].
    pub fn allreduce_group<T: Element>(
        &self,
        group: &TensorGroup,
        tensors: &mut [&mut [T]],
        options: impl Into<ReduceOptions>,
    ) -> Result<(), Error> {
        let options = options.into();
        self.blocking_scope(|s| s.allreduce_group_slices(group, tensors, options)?.wait())
    }

    /// [`Kolo::grouped_allreduce`] without blocking: one handle for the
    /// group, which writes every result back when all are done.
    ///
    /// The inputs are copied into one staging buffer that the engine reduces
    /// in place, as it does a scope's lent tensors (one collective over the
    /// whole submission when it fuses whole), and the handle copies the
    /// results out of it: two passes over the data and one allocation for
    /// the group, not one per tensor.
    pub fn grouped_allreduce_async<'t, 'n, T: Element>(
        &self,
        tensors: impl IntoIterator<Item = (&'n str, TensorMut<'t, T>)>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'t, ()>, Error> {
        let options = options.into();
        let tensors = tensors.into_iter();
        let template = self.reduce_params(RequestKind::Allreduce, &[], T::DTYPE, options);
        let mut checked = Vec::with_capacity(tensors.size_hint().0);
        for (name, tensor) in tensors {
            let (data, shape) = tensor.into_parts();
            check(name, shape_problem(&shape, data.len()))?;
            checked.push((name, data, shape));
        }
        let group = Submission::new(template, checked.len(), false, None);
        let names: Vec<&'n str> = checked.iter().map(|(name, ..)| *name).collect();
        let tensors = checked
            .into_iter()
            .map(|(_, data, shape)| (data, shape))
            .collect();
        self.submit_staged(group, Some(&names), tensors)
    }

    /// Allreduces the tensors of `group` without blocking and without a
    /// scope: `tensors` gives one buffer per tensor, in the group's order,
    /// and the handle writes every result back when all are done. Staged
    /// as [`Kolo::grouped_allreduce_async`] stages, and recognised by the
    /// [`TensorGroup`] as [`crate::Scope::allreduce_group_async`] is. A
    /// count or shape that does not fit is an [`Error::InvalidArgument`]
    /// naming the tensor; on an error nothing is submitted.
    pub fn allreduce_group_async<'t, T: Element, V: Into<TensorMut<'t, T>>>(
        &self,
        group: &TensorGroup,
        tensors: impl IntoIterator<Item = V>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'t, ()>, Error> {
        let options = options.into();
        let template = self.reduce_params(RequestKind::Allreduce, &[], T::DTYPE, options);
        let mut checked = Vec::with_capacity(group.len());
        group.each_buffer(tensors.into_iter().map(Into::into), |data, shape| {
            checked.push((data, Dims::from_slice(shape)))
        })?;
        let submission = Submission::known(template, group.list(), None);
        self.submit_staged(submission, None, checked)
    }

    /// Copies `tensors` into one staging buffer, lends its segments to
    /// `group` in order (named by `names`, or a [`TensorGroup`]'s), which
    /// keeps the buffer, and submits it; the handle copies the results out
    /// of the buffer into `tensors`.
    fn submit_staged<'t, 'n, T: Element>(
        &self,
        mut group: Submission<'n>,
        names: Option<&[&'n str]>,
        tensors: Vec<(&'t mut [T], Dims)>,
    ) -> Result<Handle<'t, ()>, Error> {
        let mut staging: Vec<T> = Vec::with_capacity(tensors.iter().map(|(d, _)| d.len()).sum());
        for (data, _) in &tensors {
            staging.extend_from_slice(data);
        }
        let mut rest = &mut staging[..];
        for (index, (data, shape)) in tensors.iter().enumerate() {
            let (segment, tail) = std::mem::take(&mut rest).split_at_mut(data.len());
            match names.and_then(|names| names.get(index)) {
                Some(name) => group.push_lent(name, shape, segment),
                None => group.push_lent_data(shape, segment),
            }
            rest = tail;
        }
        // The segments point into `staging`'s heap memory, which does not
        // move with the `Vec`: the completion keeps it until every tensor
        // is in (after the engine's last access) and only then hands it to
        // the handle; the caller never sees it while the engine works.
        group.staging = Some(Box::new(staging));
        let first = group.names.get(0).to_owned();
        let outputs: Vec<&'t mut [T]> = tensors.into_iter().map(|(data, _)| data).collect();
        let completion = self.submit(group)?;
        Ok(Handle::delivering(completion, move |outcome| {
            // A refused tensor stays as the caller passed it; every other
            // tensor was reduced on every rank and is written back, as the
            // in-place calls leave it.
            let (staging, failed, error) = match outcome {
                Ok(mut payloads) => (payloads.pop(), Vec::new(), None),
                Err(failure) => (failure.staging, failure.failed, Some(failure.error)),
            };
            if outputs.is_empty() {
                return error.map_or(Ok(()), Err);
            }
            let staging: Vec<T> = output(&first, staging)?;
            let mut results = staging.as_slice();
            for (index, dst) in outputs.into_iter().enumerate() {
                let (result, tail) = results.split_at(dst.len().min(results.len()));
                if failed.binary_search(&(index as u32)).is_err() {
                    write_back(&first, dst, result)?;
                }
                results = tail;
            }
            error.map_or(Ok(()), Err)
        }))
    }

    /// Reduces `input` across all ranks and leaves this rank's share of the
    /// first dimension in `output` (blocking). The rows are split as evenly
    /// as possible, the first ranks taking one extra row
    /// ([`crate::split_rows`]); `output` must hold exactly this rank's rows.
    pub fn reduce_scatter<'i, T: Element>(
        &self,
        name: &str,
        input: impl Into<Tensor<'i, T>>,
        output: &mut [T],
        options: impl Into<ReduceOptions>,
    ) -> Result<(), Error> {
        self.reduce_scatter_async(name, input, output, options)?
            .wait()
    }

    /// [`Kolo::reduce_scatter`] without blocking; the handle writes
    /// `output` when waited on.
    pub fn reduce_scatter_async<'i, 't, T: Element>(
        &self,
        name: &str,
        input: impl Into<Tensor<'i, T>>,
        output_buf: &'t mut [T],
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'t, ()>, Error> {
        let input = input.into();
        check(name, input.problem())?;
        // A scalar is left to the coordinator, which rejects it on every rank.
        if let Some((&rows, rest)) = input.shape().split_first() {
            let row: usize = rest.iter().product();
            let mine = split_rows(rows, self.size())
                .get(self.rank())
                .copied()
                .unwrap_or(0)
                * row;
            if output_buf.len() != mine {
                return Err(Error::InvalidArgument {
                    tensor: name.to_owned(),
                    reason: format!(
                        "rank {} keeps {} of the {rows} rows ({mine} elements), but the output holds {}",
                        self.rank(),
                        mine / row.max(1),
                        output_buf.len()
                    ),
                });
            }
        }
        let params = self.reduce_params(
            RequestKind::ReduceScatter,
            input.shape(),
            T::DTYPE,
            options.into(),
        );
        let completion =
            self.submit_one(name, params, Input::Owned(Box::new(input.data().to_vec())))?;
        let tensor = name.to_owned();
        Ok(Handle::new(completion, move |mut payloads| {
            let result: Vec<T> = output(&tensor, payloads.pop())?;
            write_back(&tensor, output_buf, &result)
        }))
    }

    /// The parameters of a `kind` collective on a tensor of `shape`.
    pub(crate) fn params(&self, kind: RequestKind, dtype: DataType, shape: &[usize]) -> Params {
        Params {
            shape: wire_shape(shape),
            ..Params::new(kind, dtype, [])
        }
    }

    /// The parameters of a reduction with `options`.
    pub(crate) fn reduce_params(
        &self,
        kind: RequestKind,
        shape: &[usize],
        dtype: DataType,
        options: ReduceOptions,
    ) -> Params {
        Params {
            reduce_op: options.op,
            prescale: options.prescale,
            postscale: options.postscale,
            ..self.params(kind, dtype, shape)
        }
    }
}
