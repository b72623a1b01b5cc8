//! Allreduce (one tensor, a [`TensorGroup`]) and reduce-scatter: blocking
//! on [`Kolo`], asynchronous in a [`Scope`].

use super::{check, output, write_back, ReduceOptions};
use crate::engine::submission::{Input, Submission};
use crate::error::Error;
use crate::group::TensorGroup;
use crate::handle::Handle;
use crate::kolo::Kolo;
use crate::placed::{IntoTensor, IntoTensorMut, Placed, PlacedMut};
use crate::scope::Scope;
use crate::split::split_rows;
use crate::tensor::{shape_problem, wire_shape};
use kolo_protocol::{Compression, DataType, Params, RequestKind};
use kolo_transport::Element;

impl Kolo {
    /// Reduces `buf` across all ranks, in place (blocking; the engine
    /// works on `buf` itself, no copy). `buf` is host memory (`&mut
    /// Vec<T>`, `&mut [T]`, a [`TensorMut`](crate::TensorMut) with a
    /// shape) or, on a GPU engine, memory of its GPU (`&mut
    /// CudaSlice<T>`, a view, a `DeviceTensorMut`): see
    /// [`IntoTensorMut`]. `options` is a [`ReduceOp`] or
    /// [`ReduceOptions`] with scale factors. On an error `buf` is left as
    /// it was, unless the backend failed mid-collective (a peer died),
    /// which leaves its contents unspecified, as with MPI or NCCL.
    ///
    /// [`ReduceOp`]: kolo_protocol::ReduceOp
    pub fn allreduce<'t>(
        &self,
        name: &str,
        buf: impl IntoTensorMut<'t>,
        options: impl Into<ReduceOptions>,
    ) -> Result<(), Error> {
        let (buf, options) = (buf.placed(), options.into());
        self.blocking_scope(|s| s.allreduce_placed(name, buf.shorten(), options)?.wait())
    }

    /// Allreduces the tensors of `group` (blocking, in place, no copy):
    /// `tensors` gives one buffer per tensor, in the group's order, all in
    /// one memory (host, or the engine's GPU). They reach the coordinator
    /// in the same cycle and fuse as far as the fusion threshold allows;
    /// the engine recognises the group by the [`TensorGroup`] alone, which
    /// makes a repeated step one fused collective without reading a name.
    ///
    /// Errors follow one rule for every call that submits several tensors:
    /// a tensor that negotiation refuses (the ranks disagree on it) is left
    /// as the caller passed it, the other tensors are reduced (every rank
    /// reduced them), and the call fails with the refused tensor's error
    /// (the first one's, in the group's order, if several were refused).
    /// A count or a shape that does not fit the group, or a tensor in
    /// another memory than the first, is an [`Error::InvalidArgument`]
    /// naming the tensor, and nothing is submitted.
    ///
    /// ```
    /// let grads = kolo::threads::run(2, kolo::Config::default(), |kolo| {
    ///     let group = kolo::TensorGroup::new(["w", "b"])?;
    ///     let mut grads = vec![vec![1.0f32; 1000], vec![kolo.rank() as f32; 10]];
    ///     for _step in 0..3 {
    ///         kolo.allreduce_group(&group, grads.iter_mut(), kolo::ReduceOp::Max)?;
    ///     }
    ///     Ok(grads)
    /// })?;
    /// assert_eq!(grads[0][1], vec![1.0f32; 10]);
    /// # Ok::<(), kolo::Error>(())
    /// ```
    pub fn allreduce_group<'t, B: IntoTensorMut<'t>>(
        &self,
        group: &TensorGroup,
        tensors: impl IntoIterator<Item = B>,
        options: impl Into<ReduceOptions>,
    ) -> Result<(), Error> {
        let options = options.into();
        let tensors = tensors.into_iter().map(IntoTensorMut::placed);
        self.blocking_scope(|s| s.allreduce_group_placed(group, tensors, options)?.wait())
    }

    /// Reduces `input` across all ranks and leaves this rank's share of the
    /// first dimension in `output` (blocking). The rows are split as evenly
    /// as possible, the first ranks taking one extra row
    /// ([`crate::split_rows`]); `output` must hold exactly this rank's rows,
    /// in the same memory as `input`.
    pub fn reduce_scatter<'i, 'o, I, O>(
        &self,
        name: &str,
        input: I,
        output: O,
        options: impl Into<ReduceOptions>,
    ) -> Result<(), Error>
    where
        I: IntoTensor<'i>,
        O: IntoTensorMut<'o, Elem = I::Elem>,
    {
        let (input, output, options) = (input.placed(), output.placed(), options.into());
        self.blocking_scope(|s| {
            s.reduce_scatter_placed(name, input.shorten(), output.shorten(), options)?
                .wait()
        })
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
            compression: match kind {
                RequestKind::Allreduce => options.compression,
                _ => Compression::None,
            },
            ..self.params(kind, dtype, shape)
        }
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Submits an allreduce of `buf` (host or GPU memory, see
    /// [`Kolo::allreduce`]), reduced in place by the engine (no copy); the
    /// result is in `buf` once the handle completed, and at the latest
    /// when the scope has returned.
    pub fn allreduce_async(
        &self,
        name: &str,
        buf: impl IntoTensorMut<'scope>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'scope, ()>, Error> {
        self.allreduce_placed(name, buf.placed(), options.into())
    }

    /// [`Scope::allreduce_async`] of a tensor already placed.
    pub(crate) fn allreduce_placed<T: Element>(
        &self,
        name: &str,
        buf: PlacedMut<'scope, T>,
        options: ReduceOptions,
    ) -> Result<Handle<'scope, ()>, Error> {
        let (data, shape) = match buf {
            PlacedMut::Host(tensor) => tensor.into_parts(),
            #[cfg(feature = "nccl")]
            PlacedMut::Device(tensor) => return self.allreduce_on_device(name, tensor, options),
        };
        check(name, shape_problem(&shape, data.len()))?;
        let template = self
            .kolo()
            .reduce_params(RequestKind::Allreduce, &[], T::DTYPE, options);
        let mut submission = Submission::new(template, 1, false, Some(self.lease()));
        submission.push_lent(name, &shape, data);
        let completion = self.kolo().submit(self.quietly(submission))?;
        Ok(Handle::new(completion, |_| Ok(())))
    }

    /// Submits the allreduces of the tensors of `group`, reduced in place
    /// (no copy): `tensors` gives one buffer per tensor (host or GPU
    /// memory, as [`Kolo::allreduce_group`] takes them), in the group's
    /// order; one handle for them all. The errors follow
    /// [`Kolo::allreduce_group`]'s rule; on an error at submission nothing
    /// is submitted.
    pub fn allreduce_group_async<B: IntoTensorMut<'scope>>(
        &self,
        group: &TensorGroup,
        tensors: impl IntoIterator<Item = B>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'scope, ()>, Error> {
        let tensors = tensors.into_iter().map(IntoTensorMut::placed);
        self.allreduce_group_placed(group, tensors, options.into())
    }

    /// [`Scope::allreduce_group_async`] of tensors already placed; the
    /// first tensor's memory is the group's.
    pub(crate) fn allreduce_group_placed<'p: 'scope, T: Element>(
        &self,
        group: &TensorGroup,
        tensors: impl Iterator<Item = PlacedMut<'p, T>>,
        options: ReduceOptions,
    ) -> Result<Handle<'scope, ()>, Error> {
        #[cfg_attr(not(feature = "nccl"), allow(unused_mut))]
        let mut tensors = tensors.map(PlacedMut::shorten).peekable();
        #[cfg(feature = "nccl")]
        if let Some(PlacedMut::Device(_)) = tensors.peek() {
            return self.allreduce_group_on_device(group, tensors, options);
        }
        let template = self
            .kolo()
            .reduce_params(RequestKind::Allreduce, &[], T::DTYPE, options);
        let mut submission = Submission::known(template, group.list(), Some(self.lease()));
        lend_group(&mut submission, group, tensors)?;
        let completion = self.kolo().submit(self.quietly(submission))?;
        Ok(Handle::new(completion, |_| Ok(())))
    }

    /// Submits a reduce-scatter of `input` into `output` (see
    /// [`Kolo::reduce_scatter`]); on the host `input` is copied at
    /// submission, and the handle writes this rank's rows into `output`
    /// when it completes.
    pub fn reduce_scatter_async<I, O>(
        &self,
        name: &str,
        input: I,
        output: O,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'scope, ()>, Error>
    where
        I: IntoTensor<'scope>,
        O: IntoTensorMut<'scope, Elem = I::Elem>,
    {
        self.reduce_scatter_placed(name, input.placed(), output.placed(), options.into())
    }

    /// [`Scope::reduce_scatter_async`] of tensors already placed.
    pub(crate) fn reduce_scatter_placed<T: Element>(
        &self,
        name: &str,
        input: Placed<'scope, T>,
        out: PlacedMut<'scope, T>,
        options: ReduceOptions,
    ) -> Result<Handle<'scope, ()>, Error> {
        let (input, output_buf) = match (input, out) {
            (Placed::Host(input), PlacedMut::Host(output)) => (input, output.into_parts().0),
            #[cfg(feature = "nccl")]
            (Placed::Device(input), PlacedMut::Device(output)) => {
                return self.reduce_scatter_on_device(name, input, output, options)
            }
            #[cfg(feature = "nccl")]
            (input, output) => return Err(memories_differ(name, input.memory(), output.memory())),
        };
        check(name, input.problem())?;
        let kolo = self.kolo();
        my_rows(kolo, name, input.shape(), output_buf.len())?;
        let params =
            kolo.reduce_params(RequestKind::ReduceScatter, input.shape(), T::DTYPE, options);
        let completion =
            self.submit_one(name, params, Input::Owned(Box::new(input.data().to_vec())))?;
        let tensor = name.to_owned();
        Ok(Handle::new(completion, move |mut payloads| {
            let result: Vec<T> = output(&tensor, payloads.pop())?;
            write_back(&tensor, output_buf, &result)
        }))
    }
}

/// The error of a reduce-scatter whose input and output live in
/// different memories.
#[cfg(feature = "nccl")]
fn memories_differ(name: &str, input: &str, output: &str) -> Error {
    Error::InvalidArgument {
        tensor: name.to_owned(),
        reason: format!("the input is in {input}, but the output is in {output}"),
    }
}

/// Fails unless an output of `held` elements holds exactly this rank's
/// share of a reduce-scatter of a tensor of `shape`. A scalar is left to
/// the coordinator, which rejects it on every rank.
pub(crate) fn my_rows(kolo: &Kolo, name: &str, shape: &[usize], held: usize) -> Result<(), Error> {
    let Some((&rows, rest)) = shape.split_first() else {
        return Ok(());
    };
    let row: usize = rest.iter().product();
    let mine = split_rows(rows, kolo.size())
        .get(kolo.rank())
        .copied()
        .unwrap_or(0)
        * row;
    if held != mine {
        return Err(Error::InvalidArgument {
            tensor: name.to_owned(),
            reason: format!(
                "rank {} keeps {} of the {rows} rows ({mine} elements), but the output holds {held}",
                kolo.rank(),
                mine / row.max(1),
            ),
        });
    }
    Ok(())
}

/// Adds the host buffers `tensors` of `group`'s tensors to `submission`,
/// lent, once [`TensorGroup::each_buffer`] checked them. Kept out of
/// line: a loop of its own, whatever the caller's iterator (inlined into
/// a caller's step closure, such loops spilled their vectors' lengths to
/// the stack on every tensor).
#[inline(never)]
fn lend_group<'scope, T: Element>(
    submission: &mut Submission<'_>,
    group: &TensorGroup,
    tensors: impl Iterator<Item = PlacedMut<'scope, T>>,
) -> Result<(), Error> {
    group.each_buffer(tensors, |data, shape| {
        submission.push_lent_data(shape, data)
    })
}
