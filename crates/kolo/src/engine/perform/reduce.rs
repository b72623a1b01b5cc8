//! Allreduce and reduce-scatter, fused through kolo-fusion.

use super::device_of;
use super::{observer, take_input, to_usize, ParamsOf, Performer};
use crate::engine::batches::Whole;
use crate::engine::completion::Payload;
use crate::engine::placement::PlaneSlot;
use crate::engine::submission::Input;
use crate::engine::table::Entry;
use crate::error::Error;
use crate::split::{row_elems, split_rows};
use kolo_protocol::Response;
use kolo_timeline::activity;
use kolo_transport::{Backend, Element, Scale};

/// The first tensor name of a response ("" for none).
fn first_name(response: &Response) -> &str {
    response.tensor_names.first().map_or("", String::as_str)
}

/// The scale factors of a response.
fn scale_of(response: &Response) -> Scale {
    Scale {
        prescale: response.prescale,
        postscale: response.postscale,
    }
}

/// The shape of reduce-scatter tensor `index` as a rank that joined sees
/// it: `[rows, elements / rows]` when the response carries the first
/// dimension of each tensor in `first_dims`, else 1-D (exact for 1-D
/// tensors).
fn joined_shape(response: &Response, index: usize, elements: u64) -> Vec<u64> {
    match response.first_dims.get(index) {
        Some(&rows) if rows > 0 && response.first_dims.len() == response.tensor_names.len() => {
            vec![rows, elements / rows]
        }
        _ => vec![elements],
    }
}

/// Where one tensor of a fused allreduce is reduced: the caller's lent
/// memory (in the entry), the engine's own copy, or a stand-in of the
/// reduce op's identity (this rank joined, or its entry failed).
enum Buffer<T> {
    Lent,
    Owned(Vec<T>),
}

impl<B: Backend, D: PlaneSlot> Performer<B, D> {
    /// Allreduces the tensors of the responses `parts` (one fusion class)
    /// in place, as one collective. `names` are their names when the
    /// timeline records them (empty otherwise).
    pub(crate) fn allreduce<T: Element>(
        &mut self,
        parts: &[&Response],
        names: &[&str],
        mut slots: Vec<Option<Entry>>,
        params: ParamsOf<'_>,
    ) {
        let Some(&head) = parts.first() else {
            return;
        };
        let op = head.reduce_op;
        let mut failed = Vec::new();
        let tensor_name = |i: usize| parts.get(i).map_or("", |r| first_name(r));
        let mut buffers: Vec<Buffer<T>> = Vec::with_capacity(slots.len());
        for (i, slot) in slots.iter_mut().enumerate() {
            let lent = slot
                .as_mut()
                .is_some_and(|e| matches!(&e.input, Input::Lent(l) if l.holds::<T>()));
            if lent {
                buffers.push(Buffer::Lent);
                continue;
            }
            let size = parts.get(i).map_or(0, |r| {
                to_usize(r.tensor_sizes.first().copied().unwrap_or(0))
            });
            buffers.push(Buffer::Owned(
                take_input::<T>(tensor_name(i), slot, &mut failed)
                    .unwrap_or_else(|| vec![T::identity(op); size]),
            ));
        }
        self.batches.complete(failed);
        let device = device_of(&slots, params);
        let mut views: Vec<&mut [T]> = Vec::with_capacity(slots.len());
        for (slot, buffer) in slots.iter_mut().zip(buffers.iter_mut()) {
            let view = match (buffer, slot.as_mut().map(|e| &mut e.input)) {
                (Buffer::Owned(data), _) => Some(data.as_mut_slice()),
                (Buffer::Lent, Some(Input::Lent(lent))) => lent.as_mut_slice::<T>(),
                (Buffer::Lent, _) => None,
            };
            // Checked above: a lent buffer of another type was replaced.
            views.push(view.unwrap_or_default());
        }
        let result = kolo_fusion::compressed_allreduce(
            &mut self.backend,
            &mut self.buffers,
            device,
            &mut views,
            op,
            scale_of(head),
            head.compression,
            &mut observer(&self.timeline, names, activity::ALLREDUCE),
        );
        drop(views);
        if self.timeline.is_enabled() {
            for (i, slot) in slots.iter().enumerate() {
                let shape = slot.as_ref().map_or_else(
                    || vec![parts[i].tensor_sizes.first().copied().unwrap_or(0)],
                    |e| params.shape(e),
                );
                self.timeline
                    .op_end(tensor_name(i), head.dtype.name(), &shape);
            }
        }
        let mut lent_ok = Vec::with_capacity(slots.len());
        let mut done = Vec::new();
        for (i, (slot, buffer)) in slots.into_iter().zip(buffers).enumerate() {
            let Some(entry) = slot else { continue };
            match (&result, buffer) {
                (Ok(()), Buffer::Lent) => lent_ok.push(entry.part),
                (Ok(()), Buffer::Owned(data)) => {
                    done.push((entry.part, Ok(Box::new(data) as Payload)))
                }
                (Err(e), _) => done.push((
                    entry.part,
                    Err(Error::collective(tensor_name(i), e.clone())),
                )),
            }
        }
        // The lent tensors' submissions count them in only now, after the
        // collective's last access to their memory.
        self.batches.complete_ok(&lent_ok);
        self.batches.complete(done);
    }

    /// Allreduces every tensor of the claimed submission `whole` (taken
    /// out of the hold by the caller) as one collective straight over its
    /// lent memory; `head` is the first response of the fused group.
    /// Inputs that are not lent tensors of `T` (a kolo bug: every rank's
    /// request named this dtype) fail the submission's tensors — after
    /// this rank still took part in the collective with the op's identity,
    /// so that no peer waits for it.
    pub(crate) fn allreduce_whole<T: Element>(&mut self, head: &Response, whole: Whole) {
        // Inputs that are not lent `T`s take part with stand-ins of the
        // op's identity: the same segments as every peer's.
        let mut stand_ins: Vec<Vec<T>>;
        let (mut views, lent) = match self.batches.whole_views::<T>(&whole) {
            Ok(views) => (views, true),
            Err(sizes) => {
                stand_ins = sizes
                    .into_iter()
                    .map(|n| vec![T::identity(head.reduce_op); n])
                    .collect();
                (stand_ins.iter_mut().map(Vec::as_mut_slice).collect(), false)
            }
        };
        let reduced = kolo_fusion::compressed_allreduce(
            &mut self.backend,
            &mut self.buffers,
            kolo_protocol::Device::Cpu,
            &mut views,
            head.reduce_op,
            scale_of(head),
            head.compression,
            &mut |_, _| {},
        );
        drop(views);
        let result = if lent {
            reduced
        } else {
            Err(kolo_fusion::FusionError::Transport(
                kolo_transport::TransportError::Backend(format!(
                    "internal: the tensors are not lent {}",
                    T::DTYPE
                )),
            ))
        };
        // The submission counts its tensors in only now, after the
        // collective's last access to their memory.
        self.batches.complete_whole(
            whole,
            result.map_err(|e| move |name: &str| Error::collective(name, e.clone())),
        );
    }

    /// Reduce-scatters the response's tensors, fused: each rank keeps its
    /// share of the first dimension (Horovod's split, see
    /// [`split_rows`]).
    pub(crate) fn reduce_scatter<T: Element>(
        &mut self,
        response: &Response,
        mut slots: Vec<Option<Entry>>,
        params: ParamsOf<'_>,
    ) {
        let op = response.reduce_op;
        let names: Vec<&str> = response.tensor_names.iter().map(String::as_str).collect();
        let mut failed = Vec::new();
        let mut inputs: Vec<Vec<T>> = Vec::with_capacity(names.len());
        let mut shapes: Vec<Vec<u64>> = Vec::with_capacity(names.len());
        let mut counts: Vec<Vec<usize>> = Vec::with_capacity(names.len());
        for (i, (name, slot)) in names.iter().zip(&mut slots).enumerate() {
            let size = response.tensor_sizes.get(i).copied().unwrap_or(0);
            let shape = slot
                .as_ref()
                .map_or_else(|| joined_shape(response, i, size), |e| params.shape(e));
            let input = take_input::<T>(name, slot, &mut failed)
                .unwrap_or_else(|| vec![T::identity(op); to_usize(size)]);
            let row = row_elems(&shape);
            let rows = shape.first().copied().map_or(0, to_usize);
            counts.push(
                split_rows(rows, self.size)
                    .into_iter()
                    .map(|r| r.saturating_mul(row))
                    .collect(),
            );
            inputs.push(input);
            shapes.push(shape);
        }
        let mut outputs: Vec<Vec<T>> = counts
            .iter()
            .map(|c| vec![T::default(); c.get(self.rank).copied().unwrap_or(0)])
            .collect();
        self.batches.complete(failed);
        let device = device_of(&slots, params);
        let input_views: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
        let mut output_views: Vec<&mut [T]> = outputs.iter_mut().map(Vec::as_mut_slice).collect();
        let result = kolo_fusion::fused_reduce_scatter(
            &mut self.backend,
            &mut self.buffers,
            device,
            &input_views,
            &mut output_views,
            &counts,
            op,
            scale_of(response),
            &mut observer(&self.timeline, &names, activity::REDUCESCATTER),
        );
        for (((name, slot), output), mut shape) in names.iter().zip(slots).zip(outputs).zip(shapes)
        {
            if let Some(first) = shape.first_mut() {
                let rows = split_rows(to_usize(*first), self.size);
                *first = rows.get(self.rank).copied().unwrap_or(0) as u64;
            }
            let outcome = match &result {
                Ok(()) => Ok(Box::new(output) as Payload),
                Err(e) => Err(Error::collective(name, e.clone())),
            };
            self.finish(name, slot, outcome, response.dtype, &shape);
        }
    }
}
