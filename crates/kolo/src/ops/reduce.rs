//! Allreduce (one tensor, a [`TensorGroup`]) and reduce-scatter: blocking
//! on [`Kolo`], asynchronous in a [`Scope`].

use super::{check, output, write_back, ReduceOptions};
use crate::engine::submission::{Input, Submission};
use crate::error::Error;
use crate::group::TensorGroup;
use crate::handle::Handle;
use crate::kolo::Kolo;
use crate::scope::Scope;
use crate::split::split_rows;
use crate::tensor::{shape_problem, wire_shape, Tensor, TensorMut};
use kolo_protocol::{DataType, Params, RequestKind};
use kolo_transport::Element;

impl Kolo {
    /// Reduces `buf` across all ranks, in place (blocking; the engine
    /// works on `buf` itself, no copy). `options` is a [`ReduceOp`] or
    /// [`ReduceOptions`] with scale factors. On an error `buf` is left as
    /// it was, unless the backend failed mid-collective (a peer died),
    /// which leaves its contents unspecified, as with MPI or NCCL.
    ///
    /// [`ReduceOp`]: kolo_protocol::ReduceOp
    pub fn allreduce<'t, T: Element>(
        &self,
        name: &str,
        buf: impl Into<TensorMut<'t, T>>,
        options: impl Into<ReduceOptions>,
    ) -> Result<(), Error> {
        let (buf, options) = (buf.into(), options.into());
        self.blocking_scope(|s| s.allreduce_async(name, buf, options)?.wait())
    }

    /// Allreduces the tensors of `group` (blocking, in place, no copy):
    /// `tensors` holds one buffer per tensor, in the group's order. They
    /// reach the coordinator in the same cycle and fuse as far as the
    /// fusion threshold allows; the engine recognises the group by the
    /// [`TensorGroup`] alone, which makes a repeated step one fused
    /// collective without reading a name.
    ///
    /// Errors follow one rule for every call that submits several tensors:
    /// a tensor that negotiation refuses (the ranks disagree on it) is left
    /// as the caller passed it, the other tensors are reduced (every rank
    /// reduced them), and the call fails with the refused tensor's error
    /// (the first one's, in the group's order, if several were refused).
    /// A count that does not fit the group is an [`Error::InvalidArgument`]
    /// naming its first tensor, and nothing is submitted.
    pub fn allreduce_group<T: Element>(
        &self,
        group: &TensorGroup,
        tensors: &mut [&mut [T]],
        options: impl Into<ReduceOptions>,
    ) -> Result<(), Error> {
        let options = options.into();
        self.blocking_scope(|s| s.allreduce_group_slices(group, tensors, options)?.wait())
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
        let (input, options) = (input.into(), options.into());
        self.blocking_scope(|s| s.reduce_scatter_async(name, input, output, options)?.wait())
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

impl<'scope> Scope<'scope, '_> {
    /// Submits an allreduce of `buf`, reduced in place by the engine (no
    /// copy); the result is in `buf` once the handle completed, and at the
    /// latest when the scope has returned.
    pub fn allreduce_async<T: Element>(
        &self,
        name: &str,
        buf: impl Into<TensorMut<'scope, T>>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'scope, ()>, Error> {
        let (data, shape) = buf.into().into_parts();
        check(name, shape_problem(&shape, data.len()))?;
        let template =
            self.kolo()
                .reduce_params(RequestKind::Allreduce, &[], T::DTYPE, options.into());
        let mut submission = Submission::new(template, 1, false, Some(self.lease()));
        submission.push_lent(name, &shape, data);
        let completion = self.kolo().submit(self.quietly(submission))?;
        Ok(Handle::new(completion, |_| Ok(())))
    }

    /// Submits the allreduces of the tensors of `group`, reduced in place
    /// (no copy): `tensors` gives one buffer per tensor (a slice, a
    /// `Vec` or a [`TensorMut`] with a shape), in the group's order; one
    /// handle for them all. The errors follow [`Kolo::allreduce_group`]'s
    /// rule; on an error at submission nothing is submitted.
    pub fn allreduce_group_async<T: Element, V: Into<TensorMut<'scope, T>>>(
        &self,
        group: &TensorGroup,
        tensors: impl IntoIterator<Item = V>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'scope, ()>, Error> {
        let tensors = tensors.into_iter().map(Into::into);
        self.submit_group::<T>(group, options.into(), |submission| {
            lend_group(submission, group, tensors)
        })
    }

    /// [`Scope::allreduce_group_async`] of plain 1-D buffers (the blocking
    /// [`Kolo::allreduce_group`]): a slice's shape is its length, so
    /// nothing but the count is checked, and no view is built per tensor.
    pub(crate) fn allreduce_group_slices<T: Element>(
        &self,
        group: &TensorGroup,
        tensors: &'scope mut [&mut [T]],
        options: ReduceOptions,
    ) -> Result<Handle<'scope, ()>, Error> {
        self.submit_group::<T>(group, options, |submission| {
            group.check_count(tensors.len())?;
            for buf in tensors.iter_mut() {
                submission.push_lent_data(&[buf.len()], buf);
            }
            Ok(())
        })
    }

    /// Submits the allreduces of `group`'s tensors of `T`, whose buffers
    /// `lend` checks and lends to the submission (nothing is submitted if
    /// it fails).
    fn submit_group<T: Element>(
        &self,
        group: &TensorGroup,
        options: ReduceOptions,
        lend: impl FnOnce(&mut Submission<'_>) -> Result<(), Error>,
    ) -> Result<Handle<'scope, ()>, Error> {
        let template = self
            .kolo()
            .reduce_params(RequestKind::Allreduce, &[], T::DTYPE, options);
        let mut submission = Submission::known(template, group.list(), Some(self.lease()));
        lend(&mut submission)?;
        let completion = self.kolo().submit(self.quietly(submission))?;
        Ok(Handle::new(completion, |_| Ok(())))
    }

    /// Submits a reduce-scatter of `input` (see [`Kolo::reduce_scatter`]);
    /// `input` is copied at submission, and the handle writes this rank's
    /// rows into `output` when it completes.
    pub fn reduce_scatter_async<'i, T: Element>(
        &self,
        name: &str,
        input: impl Into<Tensor<'i, T>>,
        output_buf: &'scope mut [T],
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'scope, ()>, Error> {
        let input = input.into();
        check(name, input.problem())?;
        let kolo = self.kolo();
        // A scalar is left to the coordinator, which rejects it on every rank.
        if let Some((&rows, rest)) = input.shape().split_first() {
            let row: usize = rest.iter().product();
            let mine = split_rows(rows, kolo.size())
                .get(kolo.rank())
                .copied()
                .unwrap_or(0)
                * row;
            if output_buf.len() != mine {
                return Err(Error::InvalidArgument {
                    tensor: name.to_owned(),
                    reason: format!(
                        "rank {} keeps {} of the {rows} rows ({mine} elements), but the output holds {}",
                        kolo.rank(),
                        mine / row.max(1),
                        output_buf.len()
                    ),
                });
            }
        }
        let params = kolo.reduce_params(
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
}

/// Adds the buffers `tensors` of `group`'s tensors to `submission`, lent,
/// once [`TensorGroup::each_buffer`] checked them. Kept out of line: a
/// loop of its own, whatever the caller's iterator (inlined into a
/// caller's step closure, such loops spilled their vectors' lengths to
/// the stack on every tensor).
#[inline(never)]
fn lend_group<'scope, T: Element>(
    submission: &mut Submission<'_>,
    group: &TensorGroup,
    tensors: impl Iterator<Item = TensorMut<'scope, T>>,
) -> Result<(), Error> {
    group.each_buffer(tensors, |data, shape| {
        submission.push_lent_data(shape, data)
    })
}
