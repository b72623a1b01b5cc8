//! Enqueueing each device collective of a response on the plane's stream.
//! A rank that joined (no entry for a tensor) takes part with a spare
//! buffer: the reduce op's identity, zero rows, or a buffer to receive
//! into.

use super::allreduce::{address, alloc};
use super::plane::{
    topology, Enqueued, NcclPlane, Output, Part, PlaneError, NCCL_ALLGATHER, NCCL_ALLTOALL,
    NCCL_BROADCAST, NCCL_REDUCESCATTER,
};
use crate::device_tensor::DeviceReceived;
use crate::split::{alltoall_counts, gathered_row_elems, row_elems, split_rows};
use cudarc::driver::{CudaSlice, DeviceSlice};
use kolo_nccl::{DeviceElement, NcclComm, NcclError, Untracked, Work};
use kolo_protocol::Response;
use kolo_timeline::Timeline;
use kolo_transport::Scale;
use std::any::Any;
use std::sync::Arc;

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

/// The stand-ins of a rank that joined (no entry for a tensor): the op's
/// identity, zero rows, a buffer to receive into — allocated on the
/// plane's stream, held until the response is enqueued, then freed in
/// that stream's order (after the work using them).
struct Spares<T>(Vec<CudaSlice<T>>);

/// Which of a tensor's buffers: its input, or where its result goes.
#[derive(Clone, Copy, Debug)]
enum Side {
    Read,
    Write,
}

impl<T: DeviceElement> Spares<T> {
    /// `part`'s buffer on `side`, or a stand-in of `len` copies of `fill`
    /// where this rank has none.
    fn buffer(
        &mut self,
        comm: &NcclComm,
        part: &Part<T>,
        side: Side,
        len: usize,
        fill: T,
    ) -> Result<Untracked<T>, NcclError> {
        let own = part.args.as_ref().and_then(|a| match side {
            Side::Read => a.read.as_ref(),
            Side::Write => a.write.as_ref(),
        });
        match own {
            Some(buf) => Ok(buf.prefix(buf.len())),
            None => self.stand_in(comm, len, fill),
        }
    }

    fn stand_in(
        &mut self,
        comm: &NcclComm,
        len: usize,
        fill: T,
    ) -> Result<Untracked<T>, NcclError> {
        let mut buf = alloc(comm, len, fill)?;
        let stream = Arc::clone(comm.stream());
        // SAFETY: `buf` was allocated and filled on the plane's stream,
        // which runs the work given this address; `self` keeps it until
        // that work is enqueued, and dropping it then frees it in that
        // stream's order, after the work.
        let untracked = unsafe { Untracked::write_after(&mut buf.slice_mut(..len), &stream) };
        self.0.push(buf);
        Ok(untracked)
    }
}

impl NcclPlane {
    /// Allreduces the response's tensors in place as one fused collective
    /// (see [`super::allreduce`]): each lent tensor at its address, a
    /// stand-in of the op's identity where this rank has none.
    pub(super) fn allreduce<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
        names: &[&str],
    ) -> Result<Enqueued, PlaneError> {
        let fill = T::identity(response.reduce_op);
        let mut spares = Vec::new();
        let mut lent = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            match part.lent {
                Some(tensor) => lent.push(tensor),
                None => {
                    let len = size_of(response, i);
                    let spare = alloc(&self.comm, len, fill)?;
                    lent.push((address(&self.comm, &spare), len));
                    spares.push(spare);
                }
            }
        }
        let work = self.fused_allreduce::<T>(response, lent.into_iter(), names, timeline)?;
        // Freed in the stream's order, after the work enqueued on them.
        drop(spares);
        Ok(Enqueued {
            outputs: Vec::new(),
            last: Some(work),
        })
    }

    /// Enqueues `each` for every tensor of a response in order (one call
    /// per tensor, given the communicator, the spares, the tensor's index
    /// and part) and collects the outputs; the last call's work settles
    /// the response.
    fn per_tensor<T: DeviceElement>(
        &mut self,
        parts: &[Part<T>],
        mut each: impl FnMut(
            &mut NcclComm,
            &mut Spares<T>,
            usize,
            &Part<T>,
        ) -> Result<(Work, Option<Output>), NcclError>,
    ) -> Result<Enqueued, NcclError> {
        let mut spares = Spares(Vec::new());
        let mut outputs = Vec::with_capacity(parts.len());
        let mut last = None;
        for (i, part) in parts.iter().enumerate() {
            let (work, output) = each(&mut self.comm, &mut spares, i, part)?;
            last = Some(work);
            outputs.push(output);
        }
        Ok(Enqueued { outputs, last })
    }

    /// Broadcasts each tensor from the response's root, in place.
    pub(super) fn broadcast<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
    ) -> Result<Enqueued, NcclError> {
        let root = response.root_rank as usize;
        self.per_tensor(parts, |comm, spares, i, part| {
            let mut buf =
                spares.buffer(comm, part, Side::Write, size_of(response, i), T::default())?;
            let work = phase(timeline, &[&part.name], NCCL_BROADCAST, || {
                comm.broadcast(&mut buf, root)
            })?;
            Ok((work, None))
        })
    }

    /// Reduce-scatters each tensor: this rank keeps its share of the rows.
    pub(super) fn reduce_scatter<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
    ) -> Result<Enqueued, NcclError> {
        let (rank, size) = topology(&self.comm);
        let op = response.reduce_op;
        let scale = Scale {
            prescale: response.prescale,
            postscale: response.postscale,
        };
        self.per_tensor(parts, |comm, spares, i, part| {
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
            let input = spares.buffer(comm, part, Side::Read, total, T::identity(op))?;
            let mut output = spares.buffer(comm, part, Side::Write, mine, T::default())?;
            let work = phase(timeline, &[&part.name], NCCL_REDUCESCATTER, || {
                comm.reduce_scatter(&input, &mut output, &counts, op, scale)
            })?;
            Ok((work, None))
        })
    }

    /// Allgathers each tensor into a new buffer on the plane's stream.
    pub(super) fn allgather<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
    ) -> Result<Enqueued, NcclError> {
        let (_, size) = topology(&self.comm);
        self.per_tensor(parts, |comm, spares, i, part| {
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
            let input = spares.buffer(comm, part, Side::Read, 0, T::default())?;
            let mut gathered = alloc(comm, total, T::default())?;
            let work = phase(timeline, &[&part.name], NCCL_ALLGATHER, || {
                comm.all_gatherv(&input, &mut gathered.slice_mut(..total), &counts)
            })?;
            let trailing = part.shape.iter().skip(1).copied();
            let shape = if part.shape.is_empty() {
                vec![rows.iter().sum(), row as u64]
            } else {
                std::iter::once(rows.iter().sum()).chain(trailing).collect()
            };
            Ok((
                work,
                Some((Box::new(gathered) as Box<dyn Any + Send>, shape)),
            ))
        })
    }

    /// Exchanges each tensor: rank r's rows for rank p go to p; the output
    /// is what every peer sent, in peer order, with the received row
    /// counts.
    pub(super) fn alltoall<T: DeviceElement>(
        &mut self,
        response: &Response,
        parts: &mut [Part<T>],
        timeline: &Timeline,
    ) -> Result<Enqueued, NcclError> {
        let (rank, size) = topology(&self.comm);
        self.per_tensor(parts, |comm, spares, _, part| {
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
            let input = spares.buffer(comm, part, Side::Read, 0, T::default())?;
            let total: usize = recv_counts.iter().sum();
            let mut received = alloc(comm, total, T::default())?;
            let work = phase(timeline, &[&part.name], NCCL_ALLTOALL, || {
                comm.all_to_allv(
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
            Ok((work, Some((Box::new(output) as Box<dyn Any + Send>, shape))))
        })
    }
}
