//! The peer allreduce's registration on one GPU: every rank of a
//! controller (threads of this process in thread mode, processes under
//! `mpirun` in process mode, all on GPU 0) registers its buffer as an
//! `NcclComm` does — a pointer of the shared address space, or a CUDA IPC
//! handle opened by every other process — and the ranks run the kernels
//! across their buffers: f32 / f16 / bf16, sum and average, one-shot and
//! two-shot, sizes from 1 element to the capacity, one rank late now and
//! then, checked bit for bit against the host's reduction of every rank's
//! (deterministic) inputs.

use super::Report;
use cudarc::driver::{CudaStream, DevicePtrMut};
use kolo_nccl::crossover::PeerAllreduce;
use kolo_nccl::{Device, DeviceElement, Mode, PeerGroup};
use kolo_protocol::ReduceOp;
use kolo_transport::{Controller, Element, Scale};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Capacity of the registered buffers.
const CAPACITY: usize = 256 << 10;

/// Rank `rank`'s input element `i` of call `call`, the same on every rank.
fn input<T: Element>(rank: usize, i: usize, call: usize) -> T {
    let mag = [1.0, 1e-3, 1e3, 3.0e4][(i + call) % 4];
    let v = ((rank * 131 + i * 7 + call * 17) % 2001) as f64 - 1000.0;
    T::from_f64(v / 999.0 * mag)
}

/// Waits for `stream`, bounded (a deadlock ends the process).
fn wait(stream: &Arc<CudaStream>) -> Result<(), String> {
    let event = stream
        .record_event(None)
        .map_err(|e| format!("record: {e:?}"))?;
    let start = Instant::now();
    while !event
        .try_is_complete()
        .map_err(|e| format!("kernel failed: {e:?}"))?
    {
        if start.elapsed() > Duration::from_secs(20) {
            println!("FAIL peer group: no completion within 20 s: deadlock");
            std::process::exit(2);
        }
        std::thread::yield_now();
    }
    Ok(())
}

/// Every call for one dtype; returns the number of calls.
fn sweep<T: DeviceElement, C: Controller + ?Sized>(
    ctrl: &mut C,
    group: &PeerGroup,
    stream: &Arc<CudaStream>,
    first_call: usize,
) -> Result<usize, String> {
    let (rank, world) = (ctrl.rank(), ctrl.size());
    let cap = CAPACITY / std::mem::size_of::<T>();
    let mut buf = stream
        .alloc_zeros::<T>(cap + 1)
        .map_err(|e| format!("alloc: {e:?}"))?;
    let sizes = [1, 2, 5, 33, 511, 4099, cap - 1, cap];
    let mut call = first_call;
    for path in [PeerAllreduce::OneShot, PeerAllreduce::TwoShot] {
        for op in [ReduceOp::Sum, ReduceOp::Average] {
            for (k, &n) in sizes.iter().enumerate() {
                call += 1;
                let skew = if n < cap { k % 2 } else { 0 };
                let host: Vec<T> = (0..n).map(|i| input(rank, i, call)).collect();
                let mut view = buf.slice_mut(skew..skew + n);
                stream
                    .memcpy_htod(&host, &mut view)
                    .map_err(|e| format!("htod: {e:?}"))?;
                let (ptr, guard) = view.device_ptr_mut(stream);
                if k % 4 == 3 && rank == call % world {
                    std::thread::sleep(Duration::from_millis(20));
                }
                // SAFETY: `ptr` spans `n` elements of `T` of `buf` on this
                // group's device, alive until `wait` below; every rank makes
                // the same calls in the same order.
                unsafe { group.all_reduce(path, T::DTYPE, op, Scale::NONE, ptr, n, stream) }
                    .map_err(|e| e.to_string())?;
                drop(guard);
                wait(stream)?;
                let inputs: Vec<Vec<T>> = (0..world)
                    .map(|r| (0..n).map(|i| input(r, i, call)).collect())
                    .collect();
                let srcs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
                let mut want = inputs[0].clone();
                T::reduce_many(&mut want, &srcs, ReduceOp::Sum);
                T::scale(&mut want, Scale::NONE.postscale_for(op, world));
                let got = stream
                    .clone_dtoh(&buf.slice(skew..skew + n))
                    .map_err(|e| format!("dtoh: {e:?}"))?;
                if kolo_transport::byte_view::as_bytes(&got)
                    != kolo_transport::byte_view::as_bytes(&want)
                {
                    let i = (0..n)
                        .find(|&i| got[i].to_f64().to_bits() != want[i].to_f64().to_bits())
                        .unwrap_or(0);
                    return Err(format!(
                        "{path:?} {} of {n} {}: element {i}: got {:?}, want {:?}",
                        op.name(),
                        T::DTYPE,
                        got[i],
                        want[i]
                    ));
                }
            }
        }
    }
    Ok(call - first_call)
}

/// This rank's part: register on GPU 0 as `mode` says, run every dtype,
/// then agree that everyone is done before the buffers go.
pub fn run<C: Controller + ?Sized>(ctrl: &mut C, mode: Mode, report: &mut Report) {
    let world = ctrl.size();
    let name = format!("peer group of {world} ranks on GPU 0, {mode:?}");
    let outcome = (|| -> Result<usize, String> {
        let device = Device::open(0).map_err(|e| e.to_string())?;
        let group = PeerGroup::register(ctrl, &device, mode, CAPACITY)
            .map_err(|e| e.to_string())?
            .ok_or("registration left the kernels off (a rank could not reach a peer)")?;
        let stream = device.stream().clone();
        let mut calls = sweep::<f32, C>(ctrl, &group, &stream, 0);
        if let Ok(done) = calls {
            calls = sweep::<half::f16, C>(ctrl, &group, &stream, done).map(|n| n + done);
        }
        if let Ok(done) = calls {
            calls = sweep::<half::bf16, C>(ctrl, &group, &stream, done).map(|n| n + done);
        }
        // Nobody frees its buffer while a peer may still read it.
        let _ = wait(&stream);
        ctrl.control_barrier().map_err(|e| e.to_string())?;
        drop(group);
        calls
    })();
    report.check(
        &name,
        outcome.map(|calls| println!("  {name}: {calls} calls bitwise equal")),
    );
}
