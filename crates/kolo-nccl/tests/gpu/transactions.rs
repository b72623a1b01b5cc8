//! Device transactions, the destructive all-to-all, and copy-engine
//! operations.

use super::{compare, err, to_device, to_host, value, Report};
use kolo_nccl::{destructive_slot, CopyEngine, Mode, NcclComm};
use kolo_protocol::ReduceOp;
use kolo_transport::{Element, Scale, Topology};

fn block<T: Element>(rank: usize, count: usize, salt: usize) -> Vec<T> {
    (0..count).map(|i| value(rank, i, salt)).collect()
}

/// In-place reduce-scatter + in-place all-gather + a ring send / recv in
/// one transaction, signalled to another stream through an event.
fn sharded_step(comm: &mut NcclComm, count: usize) -> Result<(), String> {
    let (rank, n) = (comm.rank(), comm.size());
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let stream = comm.stream().clone();
    let ctx = comm.device().context().clone();
    let compute = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
    let grads: Vec<f32> = block(rank, n * count, 1);
    let mut grads_dev = to_device(&stream, &grads)?;
    let mut weights: Vec<half::bf16> = vec![half::bf16::ZERO; n * count];
    weights[rank * count..(rank + 1) * count].copy_from_slice(&block::<half::bf16>(rank, count, 2));
    let mut weights_dev = to_device(&stream, &weights)?;
    let outgoing = to_device(&stream, &block::<i32>(rank, count, 3))?;
    let mut incoming = stream
        .alloc_zeros::<i32>(count)
        .map_err(|e| format!("{e:?}"))?;
    let ready = compute.record_event(None).map_err(|e| format!("{e:?}"))?;
    let done = ctx.new_event(None).map_err(|e| format!("{e:?}"))?;
    {
        let mut tx = comm.begin_after_event(&ready).map_err(err)?;
        tx.reduce_scatter_in_place(&mut grads_dev, ReduceOp::Sum, Scale::NONE)
            .map_err(err)?;
        tx.all_gather_in_place(&mut weights_dev).map_err(err)?;
        if n > 1 {
            tx.send(&outgoing, right).map_err(err)?;
            tx.recv(&mut incoming, left).map_err(err)?;
        }
        tx.execute_and_signal(&done)
            .map_err(err)?
            .wait()
            .map_err(err)?;
    }
    compute.wait(&done).map_err(|e| format!("{e:?}"))?;
    let summed: Vec<f32> = (0..n * count)
        .map(|i| (0..n).map(|r| value::<f32>(r, i, 1)).sum())
        .collect();
    let got = to_host(&stream, &grads_dev, n * count)?;
    compare(
        &got[rank * count..(rank + 1) * count],
        &summed[rank * count..(rank + 1) * count],
        1e-5,
    )
    .map_err(|e| format!("reduce-scatter: {e}"))?;
    let want: Vec<half::bf16> = (0..n)
        .flat_map(|r| block::<half::bf16>(r, count, 2))
        .collect();
    compare(&to_host(&stream, &weights_dev, n * count)?, &want, 0.0)
        .map_err(|e| format!("all-gather: {e}"))?;
    if n > 1 {
        compare(
            &to_host(&stream, &incoming, count)?,
            &block::<i32>(left, count, 3),
            0.0,
        )
        .map_err(|e| format!("send/recv: {e}"))?;
    }
    Ok(())
}

/// Out-of-place reduce-scatter (average, scaled) and all-gather in one
/// transaction.
fn out_of_place(comm: &mut NcclComm, count: usize) -> Result<(), String> {
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.stream().clone();
    let send = to_device(&stream, &block::<f32>(rank, n * count, 4))?;
    let mut shard = stream
        .alloc_zeros::<f32>(count)
        .map_err(|e| format!("{e:?}"))?;
    let mine = to_device(&stream, &block::<f64>(rank, count, 5))?;
    let mut all = stream
        .alloc_zeros::<f64>(n * count)
        .map_err(|e| format!("{e:?}"))?;
    {
        let mut tx = comm.begin_after_stream(&stream).map_err(err)?;
        tx.reduce_scatter(
            &send,
            &mut shard,
            ReduceOp::Average,
            Scale {
                prescale: 1.0,
                postscale: 2.0,
            },
        )
        .map_err(err)?
        .all_gather(&mine, &mut all)
        .map_err(err)?;
        tx.execute().map_err(err)?.wait().map_err(err)?;
    }
    let want: Vec<f32> = (rank * count..(rank + 1) * count)
        .map(|i| (0..n).map(|r| value::<f32>(r, i, 4)).sum::<f32>() * 2.0 / n as f32)
        .collect();
    compare(&to_host(&stream, &shard, count)?, &want, 1e-5)
        .map_err(|e| format!("reduce-scatter: {e}"))?;
    let want: Vec<f64> = (0..n).flat_map(|r| block::<f64>(r, count, 5)).collect();
    compare(&to_host(&stream, &all, n * count)?, &want, 0.0).map_err(|e| format!("all-gather: {e}"))
}

/// Scale kernels inside a transaction: an in-place integer average with a
/// prescale (the whole buffer is scaled before the group) and an
/// out-of-place float max with a postscale (the send buffer stays as it
/// was).
fn scaled(comm: &mut NcclComm, count: usize) -> Result<(), String> {
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.stream().clone();
    let ints: Vec<i32> = block(rank, n * count, 8);
    let mut ints_dev = to_device(&stream, &ints)?;
    let floats: Vec<f32> = block(rank, n * count, 9);
    let floats_dev = to_device(&stream, &floats)?;
    let mut shard = stream
        .alloc_zeros::<f32>(count)
        .map_err(|e| format!("{e:?}"))?;
    {
        let mut tx = comm.begin().map_err(err)?;
        tx.reduce_scatter_in_place(
            &mut ints_dev,
            ReduceOp::Average,
            Scale {
                prescale: 2.0,
                postscale: 1.0,
            },
        )
        .map_err(err)?
        .reduce_scatter(
            &floats_dev,
            &mut shard,
            ReduceOp::Max,
            Scale {
                prescale: 1.0,
                postscale: 0.5,
            },
        )
        .map_err(err)?;
        tx.execute().map_err(err)?.wait().map_err(err)?;
    }
    let mine = rank * count..(rank + 1) * count;
    let want: Vec<i32> = mine
        .clone()
        .map(|i| {
            let sum = (0..n).fold(0i32, |acc, r| acc.wrapping_add(2 * value::<i32>(r, i, 8)));
            let mut out = [sum];
            i32::scale(&mut out, 1.0 / n as f64);
            out[0]
        })
        .collect();
    let got = to_host(&stream, &ints_dev, n * count)?;
    compare(&got[mine.clone()], &want, 0.0).map_err(|e| format!("i32 average: {e}"))?;
    let want: Vec<f32> = mine
        .map(|i| {
            (0..n)
                .map(|r| value::<f32>(r, i, 9))
                .fold(f32::MIN, f32::max)
                * 0.5
        })
        .collect();
    compare(&to_host(&stream, &shard, count)?, &want, 0.0).map_err(|e| format!("f32 max: {e}"))?;
    compare(&to_host(&stream, &floats_dev, n * count)?, &floats, 0.0)
        .map_err(|e| format!("send buffer changed: {e}"))
}

/// LLMQ's destructive all-to-all: the block from rank s lands in slot
/// `destructive_slot(rank, s, n)`.
fn destructive(comm: &mut NcclComm, count: usize) -> Result<(), String> {
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.stream().clone();
    let payload = |src: usize, dst: usize| {
        (0..count)
            .map(|i| (src * 1_000_000 + dst * 1000 + i) as i32)
            .collect::<Vec<_>>()
    };
    let host: Vec<i32> = (0..n).flat_map(|dst| payload(rank, dst)).collect();
    let mut buf = to_device(&stream, &host)?;
    {
        let mut tx = comm.begin().map_err(err)?;
        tx.destructive_all_to_all(&mut buf).map_err(err)?;
        tx.execute().map_err(err)?.wait().map_err(err)?;
    }
    let got = to_host(&stream, &buf, n * count)?;
    for src in (0..n).filter(|&s| s != rank) {
        let slot = destructive_slot(rank, src, n);
        compare(
            &got[slot * count..(slot + 1) * count],
            &payload(src, rank),
            0.0,
        )
        .map_err(|e| format!("block from rank {src}: {e}"))?;
    }
    Ok(())
}

/// All transaction checks.
pub fn run(comm: &mut NcclComm, report: &mut Report) {
    for count in [1, 1000, 1 << 18] {
        report.check(
            &format!("transaction: in-place shard step x{count}"),
            sharded_step(comm, count),
        );
        report.check(
            &format!("transaction: out-of-place x{count}"),
            out_of_place(comm, count),
        );
        report.check(
            &format!("transaction: destructive all-to-all x{count}"),
            destructive(comm, count),
        );
        report.check(
            &format!("transaction: scaled reduce-scatters x{count}"),
            scaled(comm, count),
        );
    }
    let empty = comm
        .begin()
        .and_then(|tx| tx.execute())
        .and_then(|w| w.wait())
        .map_err(err);
    report.check("transaction: empty", empty);
}

/// Copy-engine checks on a communicator built with `CopyEngine::On`
/// (thread mode only: unused by the MPI binary).
#[allow(dead_code)]
pub fn copy_engines(comm: &mut NcclComm, report: &mut Report) {
    let layout = if comm.mode() == Mode::ThreadPerGpu && comm.copy_engine() == CopyEngine::On {
        Ok(())
    } else {
        Err(format!(
            "mode {:?}, copy engine {:?}",
            comm.mode(),
            comm.copy_engine()
        ))
    };
    report.check("copy engines: thread mode with copy engines on", layout);
    let direct = comm.copy_engine_direct().unwrap_or_default();
    report.check(
        "copy engines: every peer reached directly (no host staging)",
        if direct.iter().all(|&d| d) {
            Ok(())
        } else {
            Err(format!("direct per rank: {direct:?}"))
        },
    );
    for count in [1, 4099, 1 << 20] {
        let outcome = (|| {
            let (rank, n) = (comm.rank(), comm.size());
            let stream = comm.stream().clone();
            let send = to_device(&stream, &block::<f32>(rank, count, 7))?;
            let mut recv = stream
                .alloc_zeros::<f32>(n * count)
                .map_err(|e| format!("{e:?}"))?;
            comm.all_gather(&send, &mut recv)
                .map_err(err)?
                .wait()
                .map_err(err)?;
            let want: Vec<f32> = (0..n).flat_map(|r| block::<f32>(r, count, 7)).collect();
            compare(&to_host(&stream, &recv, n * count)?, &want, 0.0)
        })();
        report.check(&format!("copy engines: all_gather f32 x{count}"), outcome);
        report.check(
            &format!("copy engines: transaction x{count}"),
            sharded_step(comm, count),
        );
    }
}
