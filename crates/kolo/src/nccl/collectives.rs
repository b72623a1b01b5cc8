//! Enqueueing each device collective of a response on the plane's stream.
//! A rank that joined (no entry for a tensor) takes part with a spare
//! buffer: the reduce op's identity, zero rows, or a buffer to receive
//! into.

use super::plane::{
    topology, NcclPlane, Part, NCCL_ALLGATHER, NCCL_ALLREDUCE, NCCL_ALLTOALL, NCCL_BROADCAST,
    NCCL_REDUCESCATTER,
};
use super::tensor::DeviceReceived;
use crate::split::{alltoall_counts, gathered_row_elems, row_elems, split_rows};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use kolo_nccl::{DeviceElement, DeviceFusionBuffer, NcclComm, NcclError};
use kolo_protocol::Response;
use kolo_timeline::{activity, Timeline};
use kolo_transport::Scale;
use std::any::Any;

/// What a response leaves per tensor: an output the engine allocated
/// (allgather's `CudaSlice<T>`, alltoall's [`DeviceReceived`]) with its
/// shape, or nothing (in-place results).
pub(crate) type Outputs = Vec<Option<(Box<dyn Any + Send>, Vec<u64>)>>;

/// A device buffer of `len` copies of `fill` (at least one element: CUDA
/// allocates no empty buffers; callers slice it to `len`).
fn spare<T: DeviceElement>(
    comm: &NcclComm,
    len: usize,
    fill: T,
) -> Result<CudaSlice<T>, NcclError> {
    comm.stream()
        .clone_htod(&vec![fill; len.max(1)])
        .map_err(|e| NcclError::Cuda {
            call: "cuMemcpyHtoDAsync",
            message: format!("{e:?}"),
        })
}

/// The element count of tensor `index` of `response`.
fn size_of(response: &Response, index: usize) -> usize {
    let n = response.tensor_sizes.get(index).copied().unwrap_or(0);
    usize::try_from(n).unwrap_or(0)
}

/// Runs `enqueue` inside the timeline activity `name` of `tensors`.
fn phase<R>(timeline: &Timeline, tensors: &[&str], name: &str, enqueue: impl FnOnce() -> R) -> R {
    timeline.activity_start_all(tensors, name);
    let out = enqueue();
    timeline.activity_end_all(tensors);
    out
}

/// The caller's buffer written by the operation of `part`, or the spare.
fn written<'a, T>(
    part: &'a mut Part<T>,
    spare: &'a mut Option<CudaSlice<T>>,
    len: usize,
) -> Result<CudaViewMut<'a, T>, NcclError> {
    match (part.args.as_mut().and_then(|a| a.output.as_mut()), spare) {
        (Some(view), _) => Ok(view.slice_mut(..)),
        (None, Some(spare)) => Ok(spare.slice_mut(..len)),
        (None, None) => Err(NcclError::InvalidArgument(format!(
            "internal: tensor '{}' has no buffer to write",
            part.name
        ))),
    }
}

/// The caller's input of `part`, or the spare.
fn read<'a, T>(
    part: &'a Part<T>,
    spare: &'a Option<CudaSlice<T>>,
    len: usize,
) -> Result<CudaView<'a, T>, NcclError> {
    match (part.args.as_ref().and_then(|a| a.input.as_ref()), spare) {
        (Some(view), _) => Ok(view.slice(..)),
        (None, Some(spare)) => Ok(spare.slice(..len)),
        (None, None) => Err(NcclError::InvalidArgument(format!(
            "internal: tensor '{}' has no input",
            part.name
        ))),
    }
}

impl NcclPlane {
    /// Allreduces the response's tensors in place: one tensor directly,
    /// several packed into the fusion buffer, reduced once, unpacked.
    pub(super) fn allreduce<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
        names: &[&str],
    ) -> Result<Outputs, NcclError> {
        let op = response.reduce_op;
        let scale = Scale {
            prescale: response.prescale,
            postscale: response.postscale,
        };
        let NcclPlane { comm, fusion } = self;
        let mut spares = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            spares.push(match part.args {
                Some(_) => None,
                None => Some(spare(comm, size_of(response, i), T::identity(op))?),
            });
        }
        let mut views = Vec::with_capacity(parts.len());
        for (i, (part, spare)) in parts.iter_mut().zip(spares.iter_mut()).enumerate() {
            views.push(written(part, spare, size_of(response, i))?);
        }
        if let [view] = views.as_mut_slice() {
            phase(timeline, names, NCCL_ALLREDUCE, || {
                comm.all_reduce(view, op, scale)
            })?;
            return Ok(Vec::new());
        }
        let fusion = match fusion {
            Some(buffer) => buffer,
            None => fusion.insert(phase(
                timeline,
                names,
                activity::INIT_FUSION_BUFFER,
                || DeviceFusionBuffer::new(comm, 0),
            )?),
        };
        let count = phase(timeline, names, activity::MEMCPY_IN_FUSION_BUFFER, || {
            let sources: Vec<CudaView<'_, T>> = views.iter().map(|v| v.as_view()).collect();
            fusion.pack(comm, &sources)
        })?;
        phase(timeline, names, NCCL_ALLREDUCE, || {
            fusion.all_reduce::<T>(comm, count, op, scale)
        })?;
        phase(timeline, names, activity::MEMCPY_OUT_FUSION_BUFFER, || {
            fusion.unpack(comm, &mut views)
        })?;
        Ok(Vec::new())
    }

    /// Broadcasts each tensor from the response's root, in place.
    pub(super) fn broadcast<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
    ) -> Result<Outputs, NcclError> {
        let root = response.root_rank as usize;
        for (i, part) in parts.iter_mut().enumerate() {
            let len = size_of(response, i);
            let mut spare_buf = match part.args {
                Some(_) => None,
                None => Some(spare(&self.comm, len, T::default())?),
            };
            let name = part.name.clone();
            let mut view = written(part, &mut spare_buf, len)?;
            phase(timeline, &[&name], NCCL_BROADCAST, || {
                self.comm.broadcast(&mut view, root)
            })?;
        }
        Ok(Vec::new())
    }

    /// Reduce-scatters each tensor: this rank keeps its share of the rows.
    pub(super) fn reduce_scatter<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
    ) -> Result<Outputs, NcclError> {
        let (rank, size) = topology(&self.comm);
        let op = response.reduce_op;
        let scale = Scale {
            prescale: response.prescale,
            postscale: response.postscale,
        };
        for (i, part) in parts.iter_mut().enumerate() {
            let total = size_of(response, i);
            let rows = response
                .first_dims
                .get(i)
                .and_then(|&r| usize::try_from(r).ok())
                .unwrap_or(0);
            let row = if part.shape.is_empty() {
                total.checked_div(rows).unwrap_or(0)
            } else {
                row_elems(&part.shape)
            };
            let counts: Vec<usize> = split_rows(rows, size)
                .into_iter()
                .map(|r| r.saturating_mul(row))
                .collect();
            let mine = counts.get(rank).copied().unwrap_or(0);
            let (spare_in, mut spare_out) = match part.args {
                Some(_) => (None, None),
                None => (
                    Some(spare(&self.comm, total, T::identity(op))?),
                    Some(spare(&self.comm, mine, T::default())?),
                ),
            };
            let name = part.name.clone();
            let (mine_in, mine_out) = match part.args.as_mut() {
                Some(args) => (
                    args.input.as_ref().map(|v| v.slice(..)),
                    args.output.as_mut().map(|v| v.slice_mut(..)),
                ),
                None => (None, None),
            };
            let missing = |what: &str| {
                NcclError::InvalidArgument(format!("internal: tensor '{name}' has no {what}"))
            };
            let input = match (mine_in, &spare_in) {
                (Some(view), _) => view,
                (None, Some(spare)) => spare.slice(..total),
                (None, None) => return Err(missing("input")),
            };
            let mut output = match (mine_out, spare_out.as_mut()) {
                (Some(view), _) => view,
                (None, Some(spare)) => spare.slice_mut(..mine),
                (None, None) => return Err(missing("output")),
            };
            phase(timeline, &[&name], NCCL_REDUCESCATTER, || {
                self.comm
                    .reduce_scatter(&input, &mut output, &counts, op, scale)
            })?;
        }
        Ok(Vec::new())
    }

    /// Allgathers each tensor into a new buffer on the plane's stream.
    pub(super) fn allgather<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
    ) -> Result<Outputs, NcclError> {
        let (_, size) = topology(&self.comm);
        let mut outputs = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let rows: Vec<u64> = response
                .first_dims
                .iter()
                .skip(i * size)
                .take(size)
                .copied()
                .collect();
            let row = if part.shape.is_empty() {
                gathered_row_elems(&response.tensor_sizes, &response.first_dims, i, size)
            } else {
                row_elems(&part.shape)
            };
            let counts: Vec<usize> = rows
                .iter()
                .map(|&r| usize::try_from(r).unwrap_or(0).saturating_mul(row))
                .collect();
            let total: usize = counts.iter().sum();
            let spare_in = match part.args {
                Some(_) => None,
                None => Some(spare(&self.comm, 0, T::default())?),
            };
            let input = read(part, &spare_in, 0)?;
            let mut gathered = spare(&self.comm, total, T::default())?;
            phase(timeline, &[&part.name], NCCL_ALLGATHER, || {
                self.comm
                    .all_gatherv(&input, &mut gathered.slice_mut(..total), &counts)
            })?;
            let trailing = part.shape.iter().skip(1).copied();
            let shape = if part.shape.is_empty() {
                vec![rows.iter().sum(), row as u64]
            } else {
                std::iter::once(rows.iter().sum()).chain(trailing).collect()
            };
            outputs.push(Some((Box::new(gathered) as Box<dyn Any + Send>, shape)));
        }
        Ok(outputs)
    }

    /// Exchanges each tensor: rank r's rows for rank p go to p; the output
    /// is what every peer sent, in peer order, with the received row
    /// counts.
    pub(super) fn alltoall<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
    ) -> Result<Outputs, NcclError> {
        let (rank, size) = topology(&self.comm);
        let mut outputs = Vec::with_capacity(parts.len());
        for part in parts.iter() {
            let row = if part.shape.is_empty() {
                0
            } else {
                row_elems(&part.shape)
            };
            let (send_counts, recv_counts) = alltoall_counts(&response.splits, size, rank, row)
                .ok_or_else(|| {
                    NcclError::InvalidArgument(format!(
                        "the alltoall splits {:?} do not form a {size}x{size} matrix",
                        response.splits
                    ))
                })?;
            let spare_in = match part.args {
                Some(_) => None,
                None => Some(spare(&self.comm, 0, T::default())?),
            };
            let input = read(part, &spare_in, 0)?;
            let total: usize = recv_counts.iter().sum();
            let mut received = spare(&self.comm, total, T::default())?;
            phase(timeline, &[&part.name], NCCL_ALLTOALL, || {
                self.comm.all_to_allv(
                    &input,
                    &send_counts,
                    &mut received.slice_mut(..total),
                    &recv_counts,
                )
            })?;
            let splits: Vec<usize> = (0..size)
                .map(|p| {
                    response
                        .splits
                        .get(p * size + rank)
                        .and_then(|&r| usize::try_from(r).ok())
                        .unwrap_or(0)
                })
                .collect();
            let shape: Vec<u64> = std::iter::once(splits.iter().sum::<usize>() as u64)
                .chain(part.shape.iter().skip(1).copied())
                .collect();
            let output = DeviceReceived {
                data: received,
                splits,
            };
            outputs.push(Some((Box::new(output) as Box<dyn Any + Send>, shape)));
        }
        Ok(outputs)
    }
}
