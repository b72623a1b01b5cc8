//! Allgather (fused through kolo-fusion), broadcast and alltoall.

use super::device_of;
use super::{observer, take_input, to_usize, ParamsOf, Performer};
use crate::engine::completion::Payload;
use crate::engine::placement::PlaneSlot;
use crate::engine::table::Entry;
use crate::error::Error;
use crate::split::{alltoall_counts, gathered_row_elems, row_elems};
use kolo_protocol::Response;
use kolo_timeline::activity;
use kolo_transport::{Backend, Element, TransportError};

impl<B: Backend, D: PlaneSlot> Performer<B, D> {
    /// Allgathers the response's tensors, fused; each output is every
    /// rank's rows in rank order.
    pub(crate) fn allgather<T: Element>(
        &mut self,
        response: &Response,
        mut slots: Vec<Option<Entry>>,
        params: ParamsOf<'_>,
    ) {
        let names: Vec<&str> = response.tensor_names.iter().map(String::as_str).collect();
        let mut failed = Vec::new();
        let size = self.size;
        let mut inputs: Vec<Vec<T>> = Vec::with_capacity(names.len());
        let mut rows: Vec<usize> = Vec::with_capacity(names.len());
        let mut trailing: Vec<Vec<u64>> = Vec::with_capacity(names.len());
        for (i, (name, slot)) in names.iter().zip(&mut slots).enumerate() {
            match slot.as_ref().map(|e| params.shape(e)) {
                Some(shape) => {
                    rows.push(row_elems(&shape));
                    trailing.push(shape.get(1..).unwrap_or_default().to_vec());
                }
                None => {
                    let row =
                        gathered_row_elems(&response.tensor_sizes, &response.first_dims, i, size);
                    rows.push(row);
                    trailing.push(vec![row as u64]);
                }
            }
            inputs.push(take_input::<T>(name, slot, &mut failed).unwrap_or_default());
        }
        self.batches.complete(failed);
        let device = device_of(&slots, params);
        let input_views: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
        let result = kolo_fusion::fused_allgather(
            &mut self.backend,
            &mut self.buffers,
            device,
            &input_views,
            &rows,
            &response.first_dims,
            &mut observer(&self.timeline, &names, activity::ALLGATHER),
        );
        match result {
            Ok(outputs) => {
                for (i, ((name, slot), output)) in names.iter().zip(slots).zip(outputs).enumerate()
                {
                    let gathered: u64 = response.first_dims.iter().skip(i * size).take(size).sum();
                    let shape: Vec<u64> = std::iter::once(gathered)
                        .chain(trailing[i].iter().copied())
                        .collect();
                    self.finish(name, slot, Ok(Box::new(output)), response.dtype, &shape);
                }
            }
            Err(e) => {
                for (name, slot) in names.iter().zip(slots) {
                    self.finish(
                        name,
                        slot,
                        Err(Error::collective(name, e.clone())),
                        response.dtype,
                        &[],
                    );
                }
            }
        }
    }

    /// Broadcasts each of the response's tensors from the root.
    pub(crate) fn broadcast<T: Element>(
        &mut self,
        response: &Response,
        slots: Vec<Option<Entry>>,
        params: ParamsOf<'_>,
    ) {
        let root = response.root_rank as usize;
        for (i, (name, mut slot)) in response.tensor_names.iter().zip(slots).enumerate() {
            let size = to_usize(response.tensor_sizes.get(i).copied().unwrap_or(0));
            let mut failed = Vec::new();
            let mut buf = take_input::<T>(name, &mut slot, &mut failed)
                .unwrap_or_else(|| vec![T::default(); size]);
            self.batches.complete(failed);
            let names = [name.as_str()];
            let mut observe = observer(&self.timeline, &names, activity::BROADCAST);
            observe(kolo_fusion::Phase::Collective, kolo_fusion::Edge::Start);
            let result = self.backend.broadcast(&mut buf, root);
            observe(kolo_fusion::Phase::Collective, kolo_fusion::Edge::End);
            drop(observe);
            let shape = slot
                .as_ref()
                .map_or_else(|| vec![buf.len() as u64], |e| params.shape(e));
            let outcome = result
                .map(|()| Box::new(buf) as Payload)
                .map_err(|e| Error::collective(name, e));
            self.finish(name, slot, outcome, response.dtype, &shape);
        }
    }

    /// Exchanges each of the response's tensors: rank r's rows for rank p
    /// go to p; the output is what every peer sent, in peer order, with
    /// the received row counts.
    pub(crate) fn alltoall<T: Element>(
        &mut self,
        response: &Response,
        slots: Vec<Option<Entry>>,
        params: ParamsOf<'_>,
    ) {
        let (rank, size) = (self.rank, self.size);
        for (name, mut slot) in response.tensor_names.iter().zip(slots) {
            let shape = slot.as_ref().map(|e| params.shape(e)).unwrap_or_default();
            let row = if slot.is_some() { row_elems(&shape) } else { 0 };
            let mut failed = Vec::new();
            let send = take_input::<T>(name, &mut slot, &mut failed).unwrap_or_default();
            self.batches.complete(failed);
            let names = [name.as_str()];
            let mut observe = observer(&self.timeline, &names, activity::ALLTOALL);
            let result = match alltoall_counts(&response.splits, size, rank, row) {
                None => Err(TransportError::InvalidArgument(format!(
                    "the alltoall splits {:?} do not form a {size}x{size} matrix",
                    response.splits
                ))),
                Some((send_counts, recv_counts)) => {
                    let mut recv = vec![T::default(); recv_counts.iter().sum()];
                    observe(kolo_fusion::Phase::Collective, kolo_fusion::Edge::Start);
                    let done = self
                        .backend
                        .alltoallv(&send, &send_counts, &mut recv, &recv_counts);
                    observe(kolo_fusion::Phase::Collective, kolo_fusion::Edge::End);
                    let received: Vec<usize> = (0..size)
                        .map(|p| to_usize(response.splits[p * size + rank]))
                        .collect();
                    done.map(|()| (recv, received))
                }
            };
            drop(observe);
            let received_rows: u64 = (0..size)
                .filter_map(|p| response.splits.get(p * size + rank))
                .sum();
            let out_shape: Vec<u64> = std::iter::once(received_rows)
                .chain(shape.iter().skip(1).copied())
                .collect();
            let outcome = result
                .map(|out| Box::new(out) as Payload)
                .map_err(|e| Error::collective(name, e));
            self.finish(name, slot, outcome, response.dtype, &out_shape);
        }
    }
}
