//! Every device operation of `NcclComm` against a host reference.

use super::{compare, err, factor, to_device, to_host, tolerance, value, Report};
use cudarc::driver::CudaStream;
use kolo_nccl::{DeviceElement, DeviceFusionBuffer, NcclComm};
use kolo_protocol::ReduceOp;
use kolo_transport::{Element, Scale, Topology};
use std::sync::Arc;

/// Element counts of the device checks: one, odd, and 1 Mi elements.
const COUNTS: [usize; 3] = [1, 1001, 1 << 20];

pub fn inputs<T: Element>(rank: usize, count: usize, op: ReduceOp) -> Vec<T> {
    (0..count)
        .map(|i| {
            if op == ReduceOp::Product {
                factor(rank, i)
            } else {
                value(rank, i, 0)
            }
        })
        .collect()
}

/// The reduction of every rank's inputs, as kolo's kernels compute it,
/// with one factor applied to the result (divided by n for averages).
fn reference<T: Element>(n: usize, count: usize, op: ReduceOp, factor: f64) -> Vec<T> {
    reference_scaled(
        n,
        count,
        op,
        Scale {
            prescale: 1.0,
            postscale: factor,
        },
    )
}

/// kolo's scaled reduction: every input times the prescale, reduced, the
/// result times `postscale_for(op, n)` (what the host backends compute).
pub fn reference_scaled<T: Element>(n: usize, count: usize, op: ReduceOp, scale: Scale) -> Vec<T> {
    let all: Vec<Vec<T>> = (0..n)
        .map(|r| {
            let mut x = inputs(r, count, op);
            T::scale(&mut x, scale.prescale);
            x
        })
        .collect();
    let refs: Vec<&[T]> = all.iter().map(Vec::as_slice).collect();
    let mut out = vec![T::default(); count];
    T::reduce_many(&mut out, &refs, op);
    T::scale(&mut out, scale.postscale_for(op, n));
    out
}

fn ops<T: Element>() -> Vec<ReduceOp> {
    let mut ops = vec![
        ReduceOp::Sum,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Product,
    ];
    if T::DTYPE.is_float() {
        ops.push(ReduceOp::Average);
    }
    ops
}

/// All operations on `T`.
pub fn run<T: DeviceElement>(comm: &mut NcclComm, report: &mut Report) {
    let dt = T::DTYPE;
    let stream = comm.stream().clone();
    for count in COUNTS {
        for op in ops::<T>() {
            report.check(
                &format!("allreduce({}) {dt} x{count}", op.name()),
                allreduce::<T>(comm, &stream, op, count),
            );
        }
        report.check(
            &format!("allreduce_into(sum) {dt} x{count}"),
            allreduce_into::<T>(comm, &stream, count),
        );
        report.check(
            &format!("broadcast {dt} x{count}"),
            broadcast::<T>(comm, &stream, count),
        );
        report.check(
            &format!("allgather {dt} x{count}"),
            allgatherv::<T>(comm, &stream, &vec![count; comm.size()]),
        );
        report.check(
            &format!("reduce_scatter(sum) {dt} x{count}"),
            reduce_scatter::<T>(comm, &stream, &vec![count; comm.size()], Scale::NONE),
        );
    }
    let n = comm.size();
    let uneven: Vec<usize> = (0..n).map(|r| r % 3 + 1).collect();
    let with_empty: Vec<usize> = (0..n).collect();
    report.check(
        &format!("allgatherv {dt} {uneven:?}"),
        allgatherv::<T>(comm, &stream, &uneven),
    );
    report.check(
        &format!("allgatherv {dt} {with_empty:?}"),
        allgatherv::<T>(comm, &stream, &with_empty),
    );
    report.check(
        &format!("reduce_scatter(sum) {dt} {uneven:?}"),
        reduce_scatter::<T>(comm, &stream, &uneven, Scale::NONE),
    );
    report.check(&format!("alltoallv {dt}"), alltoallv::<T>(comm, &stream));
    report.check(
        &format!("send_recv ring {dt}"),
        ring::<T>(comm, &stream, 4099),
    );
    report.check(
        &format!("send then recv {dt}"),
        send_then_recv::<T>(comm, &stream, 777),
    );
    report.check(
        &format!("fusion buffer pack / allreduce / unpack {dt}"),
        fused::<T>(comm, &stream),
    );
}

/// Three tensors packed into a device fusion buffer, summed in one
/// allreduce, unpacked.
fn fused<T: DeviceElement>(comm: &mut NcclComm, stream: &Arc<CudaStream>) -> Result<(), String> {
    let lens = [3usize, 1000, 17];
    let rank = comm.rank();
    let hosts: Vec<Vec<T>> = lens
        .iter()
        .enumerate()
        .map(|(k, &len)| (0..len).map(|i| value(rank, i, k)).collect())
        .collect();
    let mut devs = hosts
        .iter()
        .map(|h| to_device(stream, h))
        .collect::<Result<Vec<_>, _>>()?;
    let mut fusion = DeviceFusionBuffer::new(comm, 64).map_err(err)?;
    let views: Vec<_> = devs
        .iter()
        .zip(lens)
        .map(|(d, len)| d.slice(..len))
        .collect();
    let count = fusion.pack(comm, &views).map_err(err)?;
    drop(views);
    fusion
        .all_reduce::<T>(comm, count, ReduceOp::Sum, Scale::NONE)
        .map_err(err)?
        .wait()
        .map_err(err)?;
    let mut outs: Vec<_> = devs
        .iter_mut()
        .zip(lens)
        .map(|(d, len)| d.slice_mut(..len))
        .collect();
    fusion.unpack(comm, &mut outs).map_err(err)?;
    drop(outs);
    for (k, (dev, &len)) in devs.iter().zip(&lens).enumerate() {
        let want: Vec<T> = (0..len)
            .map(|i| {
                let all: Vec<T> = (0..comm.size()).map(|r| value::<T>(r, i, k)).collect();
                let refs: Vec<&[T]> = all.iter().map(std::slice::from_ref).collect();
                let mut out = [T::default()];
                T::reduce_many(&mut out, &refs, ReduceOp::Sum);
                out[0]
            })
            .collect();
        compare(&to_host(stream, dev, len)?, &want, tolerance::<T>())
            .map_err(|e| format!("tensor {k}: {e}"))?;
    }
    Ok(())
}

fn allreduce<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
    op: ReduceOp,
    count: usize,
) -> Result<(), String> {
    let mut dev = to_device(stream, &inputs::<T>(comm.rank(), count, op))?;
    comm.all_reduce(&mut dev, op, Scale::NONE)
        .map_err(err)?
        .wait()
        .map_err(err)?;
    compare(
        &to_host(stream, &dev, count)?,
        &reference::<T>(comm.size(), count, op, 1.0),
        tolerance::<T>(),
    )
}

fn allreduce_into<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
    count: usize,
) -> Result<(), String> {
    let send = to_device(stream, &inputs::<T>(comm.rank(), count, ReduceOp::Sum))?;
    let mut recv = stream
        .alloc_zeros::<T>(count)
        .map_err(|e| format!("{e:?}"))?;
    comm.all_reduce_into(&send, &mut recv, ReduceOp::Sum, Scale::NONE)
        .map_err(err)?
        .wait()
        .map_err(err)?;
    compare(
        &to_host(stream, &recv, count)?,
        &reference::<T>(comm.size(), count, ReduceOp::Sum, 1.0),
        tolerance::<T>(),
    )
}

fn broadcast<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
    count: usize,
) -> Result<(), String> {
    for root in 0..comm.size() {
        let mine: Vec<T> = if comm.rank() == root {
            inputs(root, count, ReduceOp::Sum)
        } else {
            vec![T::default(); count]
        };
        let mut dev = to_device(stream, &mine)?;
        comm.broadcast(&mut dev, root)
            .map_err(err)?
            .wait()
            .map_err(err)?;
        compare(
            &to_host(stream, &dev, count)?,
            &inputs::<T>(root, count, ReduceOp::Sum),
            0.0,
        )
        .map_err(|e| format!("root {root}: {e}"))?;
    }
    Ok(())
}

fn allgatherv<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
    counts: &[usize],
) -> Result<(), String> {
    let rank = comm.rank();
    let total: usize = counts.iter().sum();
    let send = to_device(stream, &inputs::<T>(rank, counts[rank], ReduceOp::Sum))?;
    let mut recv = stream
        .alloc_zeros::<T>(total.max(1))
        .map_err(|e| format!("{e:?}"))?;
    let work = comm
        .all_gatherv(
            &send.slice(..counts[rank]),
            &mut recv.slice_mut(..total),
            counts,
        )
        .map_err(err)?;
    work.wait().map_err(err)?;
    let want: Vec<T> = counts
        .iter()
        .enumerate()
        .flat_map(|(r, &c)| inputs::<T>(r, c, ReduceOp::Sum))
        .collect();
    compare(&to_host(stream, &recv, total)?, &want, 0.0)
}

/// Scaled sum reduce-scatter with `counts` against kolo's reference.
pub fn reduce_scatter<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
    counts: &[usize],
    scale: Scale,
) -> Result<(), String> {
    let (rank, n) = (comm.rank(), comm.size());
    let total: usize = counts.iter().sum();
    let send = to_device(stream, &inputs::<T>(rank, total, ReduceOp::Sum))?;
    let mut recv = stream
        .alloc_zeros::<T>(counts[rank].max(1))
        .map_err(|e| format!("{e:?}"))?;
    comm.reduce_scatter(
        &send.slice(..total),
        &mut recv.slice_mut(..counts[rank]),
        counts,
        ReduceOp::Sum,
        scale,
    )
    .map_err(err)?
    .wait()
    .map_err(err)?;
    let start: usize = counts[..rank].iter().sum();
    let want =
        reference_scaled::<T>(n, total, ReduceOp::Sum, scale)[start..start + counts[rank]].to_vec();
    compare(
        &to_host(stream, &recv, counts[rank])?,
        &want,
        tolerance::<T>(),
    )?;
    // The send buffer is only read, also when scaled.
    compare(
        &to_host(stream, &send, total)?,
        &inputs::<T>(rank, total, ReduceOp::Sum),
        0.0,
    )
    .map_err(|e| format!("send buffer changed: {e}"))
}

fn alltoallv<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
) -> Result<(), String> {
    let (rank, n) = (comm.rank(), comm.size());
    let count = |src: usize, dst: usize| (src + dst) % 3 + 1 + 100 * ((src + dst) % 2);
    let send_counts: Vec<usize> = (0..n).map(|p| count(rank, p)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|p| count(p, rank)).collect();
    let block = |src: usize, dst: usize| {
        (0..count(src, dst))
            .map(|i| value::<T>(src, i, dst * 13))
            .collect::<Vec<T>>()
    };
    let host: Vec<T> = (0..n).flat_map(|p| block(rank, p)).collect();
    let send = to_device(stream, &host)?;
    let total: usize = recv_counts.iter().sum();
    let mut recv = stream
        .alloc_zeros::<T>(total)
        .map_err(|e| format!("{e:?}"))?;
    comm.all_to_allv(&send, &send_counts, &mut recv, &recv_counts)
        .map_err(err)?
        .wait()
        .map_err(err)?;
    let want: Vec<T> = (0..n).flat_map(|p| block(p, rank)).collect();
    compare(&to_host(stream, &recv, total)?, &want, 0.0)
}

fn ring<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
    count: usize,
) -> Result<(), String> {
    let (rank, n) = (comm.rank(), comm.size());
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let send = to_device(stream, &inputs::<T>(rank, count, ReduceOp::Sum))?;
    let mut recv = stream
        .alloc_zeros::<T>(count)
        .map_err(|e| format!("{e:?}"))?;
    comm.send_recv(&send, right, &mut recv, left)
        .map_err(err)?
        .wait()
        .map_err(err)?;
    compare(
        &to_host(stream, &recv, count)?,
        &inputs::<T>(left, count, ReduceOp::Sum),
        0.0,
    )
}

/// Standalone `send` and `recv` between ranks 0 and 1 (0 sends first, 1
/// receives first); other ranks have nothing to do.
fn send_then_recv<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
    count: usize,
) -> Result<(), String> {
    let rank = comm.rank();
    if comm.size() < 2 || rank > 1 {
        return Ok(());
    }
    let peer = 1 - rank;
    let send = to_device(stream, &inputs::<T>(rank, count, ReduceOp::Sum))?;
    let mut recv = stream
        .alloc_zeros::<T>(count)
        .map_err(|e| format!("{e:?}"))?;
    let works = if rank == 0 {
        [
            comm.send(&send, peer).map_err(err)?,
            comm.recv(&mut recv, peer).map_err(err)?,
        ]
    } else {
        [
            comm.recv(&mut recv, peer).map_err(err)?,
            comm.send(&send, peer).map_err(err)?,
        ]
    };
    for w in works {
        w.wait().map_err(err)?;
    }
    compare(
        &to_host(stream, &recv, count)?,
        &inputs::<T>(peer, count, ReduceOp::Sum),
        0.0,
    )
}
