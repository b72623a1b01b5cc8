//! Scaled reductions on the device (PreMulSum, ncclAvg and the scale
//! kernels) against kolo's host reference, and argument errors.

use super::device_ops::{inputs, reduce_scatter, reference_scaled};
use super::{compare, err, to_device, to_host, tolerance, Report};
use cudarc::driver::{CudaContext, CudaStream};
use kolo_nccl::{DeviceElement, NcclComm, NcclError};
use kolo_protocol::ReduceOp;
use kolo_transport::{Scale, Topology};
use std::sync::Arc;

/// More than the 4096 elements NCCL's single-rank PreMulSum scales.
const COUNT: usize = 4097;

fn scale(prescale: f64, postscale: f64) -> Scale {
    Scale {
        prescale,
        postscale,
    }
}

/// Every scaling path: folded float factors, ncclAvg, and the kernels
/// (integers, min / max / product, one rank), in and out of place.
pub fn scaled(comm: &mut NcclComm, report: &mut Report) {
    let stream = comm.stream().clone();
    let s = &stream;
    let checks: Vec<(&str, Result<(), String>)> = vec![
        (
            "allreduce(sum) f32 prescale 0.5 postscale 3",
            allreduce::<f32>(comm, s, ReduceOp::Sum, scale(0.5, 3.0)),
        ),
        (
            "allreduce(average) f64 postscale 2",
            allreduce::<f64>(comm, s, ReduceOp::Average, scale(1.0, 2.0)),
        ),
        (
            "allreduce(average) bf16 prescale 0.5",
            allreduce::<half::bf16>(comm, s, ReduceOp::Average, scale(0.5, 1.0)),
        ),
        (
            "allreduce(sum) f16 postscale 0.25",
            allreduce::<half::f16>(comm, s, ReduceOp::Sum, scale(1.0, 0.25)),
        ),
        (
            "allreduce(average) i32",
            allreduce::<i32>(comm, s, ReduceOp::Average, Scale::NONE),
        ),
        (
            "allreduce(sum) i64 prescale 3 postscale 0.5",
            allreduce::<i64>(comm, s, ReduceOp::Sum, scale(3.0, 0.5)),
        ),
        (
            "allreduce(sum) u8 postscale 0.5",
            allreduce::<u8>(comm, s, ReduceOp::Sum, scale(1.0, 0.5)),
        ),
        (
            "allreduce(max) f32 prescale 2 postscale -1",
            allreduce::<f32>(comm, s, ReduceOp::Max, scale(2.0, -1.0)),
        ),
        (
            "allreduce(product) bf16 postscale 0.5",
            allreduce::<half::bf16>(comm, s, ReduceOp::Product, scale(1.0, 0.5)),
        ),
        (
            "allreduce(min) i32 prescale -1.5",
            allreduce::<i32>(comm, s, ReduceOp::Min, scale(-1.5, 1.0)),
        ),
        (
            "allreduce(max) bool prescale 0 (cleared)",
            allreduce::<bool>(comm, s, ReduceOp::Max, scale(0.0, 1.0)),
        ),
        (
            "allreduce(sum) bool postscale 2 (unchanged)",
            allreduce::<bool>(comm, s, ReduceOp::Sum, scale(1.0, 2.0)),
        ),
        (
            "allreduce_into(average) i32 prescale 2 postscale 3",
            allreduce_into::<i32>(comm, s, ReduceOp::Average, scale(2.0, 3.0)),
        ),
        (
            "allreduce_into(sum) f32 prescale 0.5 postscale 3",
            allreduce_into::<f32>(comm, s, ReduceOp::Sum, scale(0.5, 3.0)),
        ),
    ];
    for (name, outcome) in checks {
        report.check(name, outcome);
    }
    let n = comm.size();
    let even = vec![257; n];
    let uneven: Vec<usize> = (0..n).map(|r| r % 3 + 1).collect();
    report.check(
        "reduce_scatter(sum) f32 prescale 0.5 postscale 3",
        reduce_scatter::<f32>(comm, s, &even, scale(0.5, 3.0)),
    );
    report.check(
        "reduce_scatter(sum) i32 prescale 0.5 postscale 3",
        reduce_scatter::<i32>(comm, s, &even, scale(0.5, 3.0)),
    );
    report.check(
        &format!("reduce_scatter(sum) i64 {uneven:?} prescale 2 postscale 0.25"),
        reduce_scatter::<i64>(comm, s, &uneven, scale(2.0, 0.25)),
    );
}

fn allreduce<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
    op: ReduceOp,
    scale: Scale,
) -> Result<(), String> {
    let mut dev = to_device(stream, &inputs::<T>(comm.rank(), COUNT, op))?;
    comm.all_reduce(&mut dev, op, scale)
        .map_err(err)?
        .wait()
        .map_err(err)?;
    compare(
        &to_host(stream, &dev, COUNT)?,
        &reference_scaled::<T>(comm.size(), COUNT, op, scale),
        tolerance::<T>(),
    )
}

fn allreduce_into<T: DeviceElement>(
    comm: &mut NcclComm,
    stream: &Arc<CudaStream>,
    op: ReduceOp,
    scale: Scale,
) -> Result<(), String> {
    let host = inputs::<T>(comm.rank(), COUNT, op);
    let send = to_device(stream, &host)?;
    let mut recv = stream
        .alloc_zeros::<T>(COUNT)
        .map_err(|e| format!("{e:?}"))?;
    comm.all_reduce_into(&send, &mut recv, op, scale)
        .map_err(err)?
        .wait()
        .map_err(err)?;
    compare(
        &to_host(stream, &recv, COUNT)?,
        &reference_scaled::<T>(comm.size(), COUNT, op, scale),
        tolerance::<T>(),
    )?;
    compare(&to_host(stream, &send, COUNT)?, &host, 0.0)
        .map_err(|e| format!("send buffer changed: {e}"))
}

/// Bad arguments are errors that name the values and leave the
/// communicator usable.
pub fn errors(comm: &mut NcclComm, report: &mut Report) {
    let stream = comm.stream().clone();
    let outcome = (|| {
        let send = stream.alloc_zeros::<f32>(4).map_err(|e| format!("{e:?}"))?;
        let mut recv = stream.alloc_zeros::<f32>(5).map_err(|e| format!("{e:?}"))?;
        match comm.all_reduce_into(&send, &mut recv, ReduceOp::Sum, Scale::NONE) {
            Err(NcclError::InvalidArgument(m)) if m.contains("send holds 4 elements, recv 5") => {}
            other => return Err(format!("mismatched lengths gave {other:?}")),
        }
        let mut shorts = stream.alloc_zeros::<i16>(4).map_err(|e| format!("{e:?}"))?;
        match comm.all_reduce(&mut shorts, ReduceOp::Sum, Scale::NONE) {
            Err(NcclError::Unsupported { .. }) => {}
            other => return Err(format!("i16 sum gave {other:?}")),
        }
        match comm.all_reduce(&mut recv, ReduceOp::Sum, scale(f64::NAN, 1.0)) {
            Err(NcclError::InvalidArgument(m)) if m.contains("not finite") => {}
            other => return Err(format!("a NaN prescale gave {other:?}")),
        }
        match comm.broadcast(&mut recv, comm.size()) {
            Err(NcclError::InvalidArgument(_)) => {}
            other => return Err(format!("root out of range gave {other:?}")),
        }
        match comm.send(&send, comm.rank()) {
            Err(NcclError::InvalidArgument(_)) => {}
            other => return Err(format!("send to self gave {other:?}")),
        }
        if CudaContext::device_count().unwrap_or(1) > 1 {
            let other =
                (comm.device().ordinal() + 1) % CudaContext::device_count().unwrap_or(1) as usize;
            let ctx = CudaContext::new(other).map_err(|e| format!("{e:?}"))?;
            let mut elsewhere = ctx
                .default_stream()
                .alloc_zeros::<f32>(4)
                .map_err(|e| format!("{e:?}"))?;
            comm.device().bind().map_err(err)?;
            match comm.all_reduce(&mut elsewhere, ReduceOp::Sum, Scale::NONE) {
                Err(NcclError::InvalidArgument(m)) if m.contains("lives on device") => {}
                other => return Err(format!("a buffer of another device gave {other:?}")),
            }
        }
        comm.check_health().map_err(err)
    })();
    report.check("argument errors are reported and harmless", outcome);
}
