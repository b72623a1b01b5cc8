//! Allreduce and reduce-scatter, fused through kolo-fusion.

use super::device_of;
use crate::background::{observer, take_in_out, take_input, to_usize, Engine, InOut};
use crate::error::Error;
use crate::handle::Payload;
use crate::split::{row_elems, split_rows};
use crate::table::Entry;
use kolo_protocol::Response;
use kolo_timeline::activity;
use kolo_transport::{Backend, Element, Scale};

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

impl<B: Backend> Engine<B> {
    /// Allreduces the response's tensors in place, fused.
    pub(crate) fn allreduce<T: Element>(
        &mut self,
        response: &Response,
        mut slots: Vec<Option<Entry>>,
    ) {
        let op = response.reduce_op;
        let names: Vec<&str> = response.tensor_names.iter().map(String::as_str).collect();
        let mut bufs: Vec<InOut<T>> = Vec::with_capacity(names.len());
        for (i, (name, slot)) in names.iter().zip(&mut slots).enumerate() {
            let size = to_usize(response.tensor_sizes.get(i).copied().unwrap_or(0));
            bufs.push(
                take_in_out::<T>(name, slot)
                    .unwrap_or_else(|| InOut::Owned(vec![T::identity(op); size])),
            );
        }
        let device = device_of(&slots);
        let mut views: Vec<&mut [T]> = bufs.iter_mut().map(InOut::as_mut_slice).collect();
        let result = kolo_fusion::fused_allreduce(
            &mut self.backend,
            &mut self.buffers,
            device,
            &mut views,
            op,
            scale_of(response),
            &mut observer(&self.timeline, &names, activity::ALLREDUCE),
        );
        for ((i, (name, slot)), buf) in names.iter().zip(slots).enumerate().zip(bufs) {
            let shape = slot.as_ref().map_or_else(
                || vec![response.tensor_sizes.get(i).copied().unwrap_or(0)],
                |e| e.request.shape.clone(),
            );
            let (payload, lent) = buf.into_output();
            let outcome = match &result {
                Ok(()) => Ok(payload),
                Err(e) => Err(Error::collective(name, e.clone())),
            };
            self.finish(name, slot, outcome, response.dtype, &shape);
            // A lent tensor goes back to its scope only now, completed.
            drop(lent);
        }
    }

    /// Reduce-scatters the response's tensors, fused: each rank keeps its
    /// share of the first dimension (Horovod's split, see
    /// [`split_rows`]).
    pub(crate) fn reduce_scatter<T: Element>(
        &mut self,
        response: &Response,
        mut slots: Vec<Option<Entry>>,
    ) {
        let op = response.reduce_op;
        let names: Vec<&str> = response.tensor_names.iter().map(String::as_str).collect();
        let mut inputs: Vec<Vec<T>> = Vec::with_capacity(names.len());
        let mut shapes: Vec<Vec<u64>> = Vec::with_capacity(names.len());
        let mut counts: Vec<Vec<usize>> = Vec::with_capacity(names.len());
        for (i, (name, slot)) in names.iter().zip(&mut slots).enumerate() {
            let size = response.tensor_sizes.get(i).copied().unwrap_or(0);
            let shape = slot.as_ref().map_or_else(
                || joined_shape(response, i, size),
                |e| e.request.shape.clone(),
            );
            let input = take_input::<T>(name, slot)
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
        let device = device_of(&slots);
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
