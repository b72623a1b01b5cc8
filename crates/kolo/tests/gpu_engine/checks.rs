//! The checks: every device op per dtype, fusion, mismatches, host
//! tensors on the GPU engine, async scopes, and the timeline file.

use crate::Report;
use kolo::nccl::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use kolo::nccl::DeviceElement;
use kolo::{Error, Kolo, ReduceOp, TensorGroup};
use std::path::Path;
use std::sync::Arc;

/// A small integer-valued input, exact in every tested dtype.
fn value<T: DeviceElement>(rank: usize, i: usize) -> T {
    T::from_f64(((rank * 7 + i * 3) % 11) as f64 - 5.0)
}

/// The sum over `size` ranks of `value(r, i)`.
fn summed<T: DeviceElement>(size: usize, i: usize) -> T {
    T::from_f64((0..size).map(|r| value::<f64>(r, i)).sum())
}

fn cuda(e: impl std::fmt::Debug) -> String {
    format!("{e:?}")
}

/// A stream of the caller on the engine's GPU.
pub fn caller_stream(kolo: &Kolo) -> Result<Arc<CudaStream>, String> {
    let gpu = kolo.gpu().ok_or("the engine has no GPU")?;
    CudaContext::new(gpu)
        .and_then(|ctx| ctx.new_stream())
        .map_err(cuda)
}

pub fn upload<T: DeviceElement>(s: &Arc<CudaStream>, host: &[T]) -> Result<CudaSlice<T>, String> {
    s.clone_htod(host).map_err(cuda)
}

pub fn download<T: DeviceElement>(
    s: &Arc<CudaStream>,
    dev: &CudaSlice<T>,
) -> Result<Vec<T>, String> {
    s.clone_dtoh(dev).map_err(cuda)
}

fn expect_eq<T: DeviceElement>(got: &[T], want: &[T]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, expected {}", got.len(), want.len()));
    }
    match got
        .iter()
        .zip(want)
        .position(|(g, w)| g.to_f64() != w.to_f64())
    {
        None => Ok(()),
        Some(i) => Err(format!(
            "index {i}: got {}, expected {}",
            got[i].to_f64(),
            want[i].to_f64()
        )),
    }
}

/// Every check of one rank.
pub fn run_all(kolo: &Kolo, report: &mut Report) {
    let stream = match caller_stream(kolo) {
        Ok(s) => s,
        Err(e) => return report.check("caller stream", Err(e)),
    };
    ops::<f32>(kolo, &stream, report);
    ops::<half::f16>(kolo, &stream, report);
    ops::<half::bf16>(kolo, &stream, report);
    ops::<i32>(kolo, &stream, report);
    report.check(
        "fusion of 100 device tensors in one op",
        fusion(kolo, &stream),
    );
    report.check(
        "a repeated device TensorGroup: one fused operation per step",
        repeated(kolo, &stream),
    );
    report.check("async device scope", scoped(kolo, &stream));
    report.check("host tensors on the GPU engine", host(kolo));
    if kolo.size() > 1 {
        report.check(
            "shape mismatch",
            mismatch(kolo, &stream, "shape", |k, s| {
                let len = 4 + 4 * k.rank();
                let mut t = upload(s, &vec![1.0f32; len])?;
                Ok(k.allreduce("mismatch/shape", &mut t, ReduceOp::Sum))
            }),
        );
        report.check(
            "dtype mismatch",
            mismatch(kolo, &stream, "data types", |k, s| {
                Ok(if k.rank() == 0 {
                    let mut t = upload(s, &[1.0f32; 4])?;
                    k.allreduce("mismatch/dtype", &mut t, ReduceOp::Sum)
                } else {
                    let mut t = upload(s, &[1i32; 4])?;
                    k.allreduce("mismatch/dtype", &mut t, ReduceOp::Sum)
                })
            }),
        );
        report.check(
            "a refused tensor of a device group is untouched, the rest reduced",
            refused(kolo, &stream),
        );
        report.check(
            "CPU/GPU mix",
            mismatch(kolo, &stream, "CPU/GPU", |k, s| {
                Ok(if k.rank() == 0 {
                    let mut t = [1.0f32; 4];
                    k.allreduce("mismatch/device", &mut t, ReduceOp::Sum)
                } else {
                    let mut t = upload(s, &[1.0f32; 4])?;
                    k.allreduce("mismatch/device", &mut t, ReduceOp::Sum)
                })
            }),
        );
    }
}

/// Every device op on dtype `T` against a host reference.
fn ops<T: DeviceElement>(kolo: &Kolo, s: &Arc<CudaStream>, report: &mut Report) {
    let dtype = T::DTYPE;
    let (rank, size) = (kolo.rank(), kolo.size());
    report.check(
        &format!("allreduce {dtype}"),
        (|| {
            let n = 1000;
            let mut t = upload(s, &(0..n).map(|i| value::<T>(rank, i)).collect::<Vec<_>>())?;
            kolo.allreduce(&format!("ar/{dtype}"), &mut t, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            expect_eq(
                &download(s, &t)?,
                &(0..n).map(|i| summed::<T>(size, i)).collect::<Vec<_>>(),
            )
        })(),
    );
    report.check(
        &format!("allgather {dtype} (rank r has r + 1 rows of 3)"),
        (|| {
            let mine: Vec<T> = (0..3 * (rank + 1)).map(|i| value::<T>(rank, i)).collect();
            let t = upload(s, &mine)?;
            let tensor = kolo::nccl::DeviceTensor::with_shape(t.as_view(), [rank + 1, 3]);
            let out = kolo
                .allgather(&format!("ag/{dtype}"), tensor)
                .map_err(|e| e.to_string())?;
            let want: Vec<T> = (0..size)
                .flat_map(|r| (0..3 * (r + 1)).map(move |i| value::<T>(r, i)))
                .collect();
            let got = download(s, &out)?;
            expect_eq(&got[..want.len().min(got.len())], &want)
        })(),
    );
    report.check(
        &format!("broadcast {dtype} from the last rank"),
        (|| {
            let root = size - 1;
            let mut t = upload(
                s,
                &(0..100).map(|i| value::<T>(rank, i)).collect::<Vec<_>>(),
            )?;
            kolo.broadcast(&format!("bc/{dtype}"), &mut t, root)
                .map_err(|e| e.to_string())?;
            expect_eq(
                &download(s, &t)?,
                &(0..100).map(|i| value::<T>(root, i)).collect::<Vec<_>>(),
            )
        })(),
    );
    report.check(
        &format!("alltoall {dtype} (p + 1 rows of 2 to rank p)"),
        (|| {
            let splits: Vec<usize> = (1..=size).collect();
            let rows: usize = splits.iter().sum();
            let send = upload(
                s,
                &(0..rows * 2)
                    .map(|i| value::<T>(rank, i))
                    .collect::<Vec<_>>(),
            )?;
            let tensor = kolo::nccl::DeviceTensor::with_shape(send.as_view(), [rows, 2]);
            let got = kolo
                .alltoall(&format!("a2a/{dtype}"), tensor, &splits)
                .map_err(|e| e.to_string())?;
            // Peer q sent me its block `rank`, which starts after its blocks 0..rank.
            let start = splits[..rank].iter().sum::<usize>() * 2;
            let want: Vec<T> = (0..size)
                .flat_map(|q| (start..start + (rank + 1) * 2).map(move |i| value::<T>(q, i)))
                .collect();
            if got.splits != vec![rank + 1; size] {
                return Err(format!("received splits {:?}", got.splits));
            }
            let data = download(s, &got.data)?;
            expect_eq(&data[..want.len().min(data.len())], &want)
        })(),
    );
    report.check(
        &format!("reduce_scatter {dtype} (2n + 1 rows of 4)"),
        (|| {
            let rows = 2 * size + 1;
            let input = upload(
                s,
                &(0..rows * 4)
                    .map(|i| value::<T>(rank, i))
                    .collect::<Vec<_>>(),
            )?;
            let split = kolo::split_rows(rows, size);
            let first: usize = split[..rank].iter().sum::<usize>() * 4;
            let mine = split[rank] * 4;
            let mut out = upload(s, &vec![T::default(); mine])?;
            let tensor = kolo::nccl::DeviceTensor::with_shape(input.as_view(), [rows, 4]);
            kolo.reduce_scatter(&format!("rs/{dtype}"), tensor, &mut out, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            expect_eq(
                &download(s, &out)?,
                &(first..first + mine)
                    .map(|i| summed::<T>(size, i))
                    .collect::<Vec<_>>(),
            )
        })(),
    );
}

/// 100 device tensors submitted together reduce in one fused operation.
fn fusion(kolo: &Kolo, s: &Arc<CudaStream>) -> Result<(), String> {
    let (rank, size) = (kolo.rank(), kolo.size());
    let mut bufs: Vec<CudaSlice<f32>> = (0..100)
        .map(|t| {
            upload(
                s,
                &(0..t * 3 + 1)
                    .map(|i| value::<f32>(rank, i + t))
                    .collect::<Vec<_>>(),
            )
        })
        .collect::<Result<_, _>>()?;
    let group =
        TensorGroup::new((0..100).map(|t| format!("fused/{t}"))).map_err(|e| e.to_string())?;
    let before = kolo.stats();
    kolo.allreduce_group(&group, bufs.iter_mut(), ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    for (t, buf) in bufs.iter().enumerate() {
        let want: Vec<f32> = (0..t * 3 + 1).map(|i| summed::<f32>(size, i + t)).collect();
        expect_eq(&download(s, buf)?, &want).map_err(|e| format!("tensor {t}: {e}"))?;
    }
    let after = kolo.stats();
    let fused = after.tensors_per_operation.get(&100).copied().unwrap_or(0)
        - before.tensors_per_operation.get(&100).copied().unwrap_or(0);
    if fused != 1 {
        return Err(format!(
            "expected one operation of 100 tensors, stats: {:?}",
            after.tensors_per_operation
        ));
    }
    Ok(())
}

/// One device TensorGroup submitted step after step (new values each
/// step, blocking and in a scope): every step's sums land in the buffers,
/// each step as one operation of all the group's tensors.
fn repeated(kolo: &Kolo, s: &Arc<CudaStream>) -> Result<(), String> {
    let (rank, size) = (kolo.rank(), kolo.size());
    let group =
        TensorGroup::new((0..50).map(|t| format!("repeat/{t}"))).map_err(|e| e.to_string())?;
    let input = |step: usize, t: usize| -> Vec<f32> {
        (0..t + 1)
            .map(|i| value::<f32>(rank, i + t + step))
            .collect()
    };
    let before = kolo.stats();
    let steps = 4;
    for step in 0..steps {
        let mut bufs: Vec<CudaSlice<f32>> = (0..50)
            .map(|t| upload(s, &input(step, t)))
            .collect::<Result<_, _>>()?;
        if step % 2 == 0 {
            kolo.allreduce_group(&group, bufs.iter_mut(), ReduceOp::Sum)
        } else {
            kolo.scope(|scope| {
                scope
                    .allreduce_group_async(&group, bufs.iter_mut(), ReduceOp::Sum)?
                    .wait()
            })
        }
        .map_err(|e| format!("step {step}: {e}"))?;
        for (t, buf) in bufs.iter().enumerate() {
            let want: Vec<f32> = (0..t + 1)
                .map(|i| summed::<f32>(size, i + t + step))
                .collect();
            expect_eq(&download(s, buf)?, &want)
                .map_err(|e| format!("step {step}, tensor {t}: {e}"))?;
        }
    }
    let after = kolo.stats();
    let ops = after.tensors_per_operation.get(&50).copied().unwrap_or(0)
        - before.tensors_per_operation.get(&50).copied().unwrap_or(0);
    if ops != steps as u64 {
        return Err(format!(
            "expected {steps} operations of 50 tensors, stats: {:?}",
            after.tensors_per_operation
        ));
    }
    Ok(())
}

/// A device group whose tensor 1 has another length on rank 1: it fails
/// with a mismatch and is left as it was; the others are reduced.
fn refused(kolo: &Kolo, s: &Arc<CudaStream>) -> Result<(), String> {
    let (rank, size) = (kolo.rank(), kolo.size());
    let group =
        TensorGroup::new(["refused/0", "refused/1", "refused/2"]).map_err(|e| e.to_string())?;
    let lens = [4, if rank == 1 { 5 } else { 4 }, 3];
    let mut bufs: Vec<CudaSlice<f32>> = lens
        .iter()
        .map(|&n| upload(s, &vec![rank as f32 + 1.0; n]))
        .collect::<Result<_, _>>()?;
    match kolo.allreduce_group(&group, bufs.iter_mut(), ReduceOp::Sum) {
        Err(Error::Mismatch { tensor, .. }) if tensor == "refused/1" => {}
        other => return Err(format!("expected a mismatch of refused/1, got {other:?}")),
    }
    let sum = (1..=size).sum::<usize>() as f32;
    expect_eq(&download(s, &bufs[0])?, &[sum; 4])?;
    expect_eq(&download(s, &bufs[1])?, &vec![rank as f32 + 1.0; lens[1]])?;
    expect_eq(&download(s, &bufs[2])?, &[sum; 3])
}

/// Two allreduces in flight at once inside a scope.
fn scoped(kolo: &Kolo, s: &Arc<CudaStream>) -> Result<(), String> {
    let (rank, size) = (kolo.rank(), kolo.size());
    let mut a = upload(s, &[rank as f32 + 1.0; 64])?;
    let mut b = upload(s, &[rank as i32 + 1; 32])?;
    kolo.scope(|scope| -> Result<(), Error> {
        let ha = scope.allreduce_async("scope/a", &mut a, ReduceOp::Sum)?;
        let hb = scope.allreduce_async("scope/b", &mut b, ReduceOp::Max)?;
        hb.wait()?;
        ha.wait()
    })
    .map_err(|e| e.to_string())?;
    let sum = (1..=size).sum::<usize>() as f32;
    expect_eq(&download(s, &a)?, &[sum; 64])?;
    expect_eq(&download(s, &b)?, &[size as i32; 32])
}

/// Host tensors keep working on the GPU engine.
fn host(kolo: &Kolo) -> Result<(), String> {
    let mut t = vec![kolo.rank() as f64 + 1.0; 10];
    kolo.allreduce("host/grad", &mut t, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let want = (1..=kolo.size()).sum::<usize>() as f64;
    expect_eq(&t, &[want; 10])
}

/// `submit` must fail on every rank with a mismatch naming the tensor,
/// `what`, and both ranks; the engine stays usable.
fn mismatch(
    kolo: &Kolo,
    s: &Arc<CudaStream>,
    what: &str,
    submit: impl Fn(&Kolo, &Arc<CudaStream>) -> Result<Result<(), Error>, String>,
) -> Result<(), String> {
    match submit(kolo, s)? {
        Err(Error::Mismatch { tensor, message }) => {
            if !message.contains(what) || !message.contains("rank 0") || !message.contains("rank 1")
            {
                return Err(format!(
                    "the message of '{tensor}' misses {what} or a rank: {message}"
                ));
            }
            host(kolo)
        }
        other => Err(format!("expected a mismatch, got {other:?}")),
    }
}

/// Rank 0's timeline has the negotiation and the device activities.
pub fn timeline(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let missing: Vec<&str> = [
        "NEGOTIATE_ALLREDUCE",
        "QUEUE",
        "MEMCPY_IN_FUSION_BUFFER",
        "NCCL_ALLREDUCE",
        "MEMCPY_OUT_FUSION_BUFFER",
        "NCCL_ALLGATHER",
        "NCCL_ALLTOALL",
        "fused/99",
    ]
    .into_iter()
    .filter(|name| !text.contains(name))
    .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("the timeline lacks {missing:?}"))
    }
}
