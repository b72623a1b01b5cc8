//! The peer allreduce kernels on one GPU: 2, 3, 4 and 8 simulated ranks
//! ([`LocalPeerRanks`]: one registered buffer and one stream per rank on
//! the same device, each rank's kernel on its own stream, all running at
//! once), against the host's `Element::reduce_many` and `Element::scale`
//! bit for bit, for sizes from 1 element to the buffer's capacity (odd
//! sizes, unaligned inputs and outputs, in place and not), f32 / f16 /
//! bf16, sum and average, one-shot and two-shot; one rank launched late
//! (after the others are spinning); many calls on the same buffers (epoch
//! and buffer reuse). Then timings of both kernels beside a copy-only
//! baseline: one GPU, no NVLink — they time the kernels, not the link.

use super::Report;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use kolo_nccl::crossover::PeerAllreduce;
use kolo_nccl::{DeviceElement, LocalPeerRanks};
use kolo_protocol::ReduceOp;
use kolo_transport::Element;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Capacity of the correctness runs' registered buffers.
const CAPACITY: usize = 1 << 20;
/// The bound on one call: past it the kernels are taken to be deadlocked.
const DEADLINE: Duration = Duration::from_secs(20);

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Waits for every stream, bounded: a deadlock is reported, and the
/// process exits (spinning kernels cannot be stopped).
fn wait_all(streams: &[Arc<CudaStream>]) -> Result<(), String> {
    let events = streams
        .iter()
        .map(|s| s.record_event(None).map_err(|e| format!("record: {e:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    let start = Instant::now();
    loop {
        let mut done = true;
        for e in &events {
            done &= e
                .try_is_complete()
                .map_err(|e| format!("kernel failed: {e:?}"))?;
        }
        if done {
            return Ok(());
        }
        if start.elapsed() > DEADLINE {
            println!("FAIL peer allreduce: no completion within {DEADLINE:?}: deadlock");
            std::process::exit(2);
        }
        std::thread::yield_now();
    }
}

/// Per-rank device input and output buffers of `len` elements.
struct Io<T> {
    inputs: Vec<CudaSlice<T>>,
    outputs: Vec<CudaSlice<T>>,
}

fn io<T: DeviceElement>(
    stream: &Arc<CudaStream>,
    world: usize,
    len: usize,
) -> Result<Io<T>, String> {
    let alloc = || {
        stream
            .alloc_zeros::<T>(len)
            .map_err(|e| format!("alloc: {e:?}"))
    };
    Ok(Io {
        inputs: (0..world).map(|_| alloc()).collect::<Result<_, _>>()?,
        outputs: (0..world).map(|_| alloc()).collect::<Result<_, _>>()?,
    })
}

/// One call of `n` elements at element offset `skew`, in place or not,
/// with `late` launched after the others have started; checked bitwise.
#[allow(clippy::too_many_arguments)]
fn one_call<T: DeviceElement>(
    ranks: &mut LocalPeerRanks,
    main: &Arc<CudaStream>,
    buffers: &mut Io<T>,
    path: PeerAllreduce,
    op: ReduceOp,
    n: usize,
    skew: usize,
    in_place: bool,
    late: Option<usize>,
    rng: &mut Rng,
) -> Result<(), String> {
    let world = ranks.streams().len();
    let elem = std::mem::size_of::<T>() as u64;
    let inputs: Vec<Vec<T>> = (0..world)
        .map(|_| {
            (0..n)
                .map(|_| {
                    let mag = [1.0, 1e-3, 1e3, 3.0e4][rng.below(4)];
                    T::from_f64((rng.below(2001) as f64 - 1000.0) / 999.0 * mag)
                })
                .collect()
        })
        .collect();
    for (dev, host) in buffers.inputs.iter_mut().zip(&inputs) {
        let mut view = dev.slice_mut(skew..skew + n);
        main.memcpy_htod(host, &mut view)
            .map_err(|e| format!("htod: {e:?}"))?;
    }
    main.synchronize().map_err(|e| format!("sync: {e:?}"))?;
    let mut pairs = Vec::with_capacity(world);
    for r in 0..world {
        let (input, _g) = buffers.inputs[r].device_ptr(main);
        let output = if in_place {
            input
        } else {
            let (o, _g) = buffers.outputs[r].device_ptr_mut(main);
            o
        };
        let at = skew as u64 * elem;
        pairs.push((output + at, input + at));
    }
    main.synchronize().map_err(|e| format!("sync: {e:?}"))?;
    let mut order: Vec<usize> = (0..world).filter(|&r| Some(r) != late).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    // SAFETY: every pair spans `n` elements (plus `skew`) of live device
    // buffers of `T`, in place or distinct, kept until `wait_all`; the
    // late rank is launched below before anything waits.
    let epoch = unsafe { ranks.launch(path, T::DTYPE, op, n, &pairs, &order) }
        .map_err(|e| e.to_string())?;
    if let Some(late) = late {
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: as above, the same call.
        unsafe { ranks.launch_late(path, T::DTYPE, op, n, &pairs, late, epoch) }
            .map_err(|e| e.to_string())?;
    }
    wait_all(ranks.streams())?;
    let srcs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    let mut want = inputs[0].clone();
    T::reduce_many(&mut want, &srcs, ReduceOp::Sum);
    T::scale(
        &mut want,
        kolo_transport::Scale::NONE.postscale_for(op, world),
    );
    for r in 0..world {
        let dev = if in_place {
            &buffers.inputs[r]
        } else {
            &buffers.outputs[r]
        };
        let got = main
            .clone_dtoh(&dev.slice(skew..skew + n))
            .map_err(|e| format!("dtoh: {e:?}"))?;
        if kolo_transport::byte_view::as_bytes(&got) != kolo_transport::byte_view::as_bytes(&want) {
            let i = (0..n)
                .find(|&i| got[i].to_f64().to_bits() != want[i].to_f64().to_bits())
                .unwrap_or(0);
            return Err(format!(
                "rank {r} element {i} of {n}: got {:?}, want {:?}",
                got[i], want[i]
            ));
        }
    }
    Ok(())
}

/// Every size, path and op for one dtype and world.
fn sweep<T: DeviceElement>(
    ctx: &Arc<CudaContext>,
    main: &Arc<CudaStream>,
    world: usize,
    report: &mut Report,
) {
    let name = format!("peer allreduce {} on {world} simulated ranks", T::DTYPE);
    let outcome = (|| -> Result<usize, String> {
        let mut ranks = LocalPeerRanks::new(ctx, world, CAPACITY).map_err(|e| e.to_string())?;
        let cap = CAPACITY / std::mem::size_of::<T>();
        let mut buffers = io::<T>(main, world, cap + 1)?;
        let mut rng = Rng(0x9E37_79B9 ^ world as u64);
        let sizes = [1, 2, 3, 7, 31, 255, 1000, 4097, 65_537, cap - 1, cap];
        let mut calls = 0;
        for path in [PeerAllreduce::OneShot, PeerAllreduce::TwoShot] {
            for op in [ReduceOp::Sum, ReduceOp::Average] {
                for (k, &n) in sizes.iter().enumerate() {
                    let skew = if n < cap { k % 2 } else { 0 };
                    let late = (k % 4 == 3).then_some(k % world);
                    one_call(
                        &mut ranks,
                        main,
                        &mut buffers,
                        path,
                        op,
                        n,
                        skew,
                        k % 3 == 0,
                        late,
                        &mut rng,
                    )
                    .map_err(|e| format!("{path:?} {} n={n}: {e}", op.name()))?;
                    calls += 1;
                }
            }
        }
        // Back-to-back calls without a host wait between them: epochs and
        // both data regions reused while peers may still be reading.
        for k in 0..64 {
            let path = if k % 2 == 0 {
                PeerAllreduce::OneShot
            } else {
                PeerAllreduce::TwoShot
            };
            one_call(
                &mut ranks,
                main,
                &mut buffers,
                path,
                ReduceOp::Sum,
                1 + rng.below(5000),
                0,
                true,
                None,
                &mut rng,
            )?;
            calls += 1;
        }
        drop(ranks);
        Ok(calls)
    })();
    report.check(
        &name,
        outcome.map(|calls| println!("  {name}: {calls} calls bitwise equal")),
    );
}

/// The correctness sweep: every world, dtype, path, op.
pub fn run(ctx: &Arc<CudaContext>, report: &mut Report) {
    let main = match ctx.new_stream() {
        Ok(s) => s,
        Err(e) => return report.check("peer allreduce: stream", Err(format!("{e:?}"))),
    };
    for world in [2, 3, 4, 8] {
        sweep::<f32>(ctx, &main, world, report);
        sweep::<half::f16>(ctx, &main, world, report);
        sweep::<half::bf16>(ctx, &main, world, report);
    }
}

/// Microseconds per call of `iters` back-to-back calls of `enqueue`.
fn time_us(
    streams: &[Arc<CudaStream>],
    iters: usize,
    mut enqueue: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..5 {
        enqueue()?;
    }
    wait_all(streams)?;
    let start = Instant::now();
    for _ in 0..iters {
        enqueue()?;
    }
    wait_all(streams)?;
    Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

/// Timings on one GPU: per call, all simulated ranks together, f32 sum.
pub fn bench(ctx: &Arc<CudaContext>) -> Result<(), String> {
    println!("peer allreduce timings on ONE GPU (simulated ranks share its SMs and memory: no NVLink, not comparable to NCCL across GPUs)");
    println!("world      bytes   one-shot us   two-shot us   copy-only us");
    let main = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
    for world in [2usize, 4, 8] {
        let cap = 8 << 20;
        let mut ranks = LocalPeerRanks::new(ctx, world, cap).map_err(|e| e.to_string())?;
        let mut buffers = io::<f32>(&main, world, cap / 4)?;
        main.synchronize().map_err(|e| format!("{e:?}"))?;
        let pairs: Vec<(u64, u64)> = (0..world)
            .map(|r| {
                let (i, _g) = buffers.inputs[r].device_ptr(&main);
                let (o, _g2) = buffers.outputs[r].device_ptr_mut(&main);
                (o, i)
            })
            .collect();
        let streams: Vec<Arc<CudaStream>> = ranks.streams().to_vec();
        let order: Vec<usize> = (0..world).collect();
        for bytes in [8usize, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20] {
            let n = bytes / 4;
            let iters = if bytes <= 1 << 20 { 200 } else { 50 };
            let mut t = Vec::new();
            for path in [PeerAllreduce::OneShot, PeerAllreduce::TwoShot] {
                t.push(time_us(&streams, iters, || {
                    // SAFETY: the pairs span `cap / 4` f32 of live buffers
                    // kept until the end of this function; every rank is
                    // launched.
                    unsafe { ranks.launch(path, f32::DTYPE, ReduceOp::Sum, n, &pairs, &order) }
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })?);
            }
            t.push(time_us(&streams, iters, || {
                for (&(out, input), s) in pairs.iter().zip(&streams) {
                    // SAFETY: both span `cap / 4` f32 of distinct live
                    // buffers, kept until the end of this function.
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(out, input, bytes, s.cu_stream())
                    }
                    .map_err(|e| format!("{e:?}"))?;
                }
                Ok(())
            })?);
            println!(
                "{world:>5} {bytes:>10} {:>13.2} {:>13.2} {:>14.2}",
                t[0], t[1], t[2]
            );
        }
        wait_all(&streams)?;
        drop(ranks);
    }
    Ok(())
}

/// A rank that never comes: rank 0 of 2 is launched alone with a 200 ms
/// timeout, and its kernel must fail (trap) rather than spin. Leaves the
/// context broken: run it last, in its own process.
pub fn dead_peer_traps(ctx: &Arc<CudaContext>) -> Result<(), String> {
    let mut ranks = LocalPeerRanks::new(ctx, 2, 1 << 20).map_err(|e| e.to_string())?;
    ranks.set_timeout(Duration::from_millis(200));
    let main = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
    let mut buffers = io::<f32>(&main, 2, 1024)?;
    main.synchronize().map_err(|e| format!("{e:?}"))?;
    let pairs: Vec<(u64, u64)> = (0..2)
        .map(|r| {
            let (i, _g) = buffers.inputs[r].device_ptr(&main);
            let (o, _g2) = buffers.outputs[r].device_ptr_mut(&main);
            (o, i)
        })
        .collect();
    let start = Instant::now();
    // SAFETY: the pairs span 1,024 f32 of live buffers, leaked below (the
    // context is broken afterwards); rank 1 is never launched on purpose:
    // the kernel must give up on it.
    unsafe {
        ranks.launch(
            PeerAllreduce::OneShot,
            f32::DTYPE,
            ReduceOp::Sum,
            1000,
            &pairs,
            &[0],
        )
    }
    .map_err(|e| e.to_string())?;
    let event = ranks.streams()[0]
        .record_event(None)
        .map_err(|e| format!("record: {e:?}"))?;
    let outcome = loop {
        match event.try_is_complete() {
            Ok(true) => break Err("the kernel completed without its peer".to_string()),
            Ok(false) if start.elapsed() > DEADLINE => {
                break Err(format!("still spinning after {DEADLINE:?}"))
            }
            Ok(false) => std::thread::yield_now(),
            Err(e) => break Ok(format!("{e:?} after {:?}", start.elapsed())),
        }
    };
    // Nothing may be freed on a broken context.
    std::mem::forget(ranks);
    std::mem::forget(buffers);
    outcome.map(|how| println!("  a dead peer: the kernel failed ({how})"))
}
