//! A quick speed check of the threads backend's allreduce (not a benchmark
//! suite; see `kolo-bench` for that): f32 sum on 2 ranks (or the count given
//! as the first argument), median latency at 8 B and bus bandwidth
//! (`bytes / time * 2(n-1)/n`) at 16 and 64 MiB. With `--generic` the same
//! runs use kolo-transport's ring algorithm over this backend's send/recv,
//! for comparison on the same (noisy) machine. With `--sweep` it prints the
//! median time of every power-of-two size from 256 B to 1 MiB instead (to
//! place the small-message threshold).
//!
//! `cargo run --release -p kolo-threads --example allreduce_speed [ranks] [--generic] [--sweep]`

use kolo_protocol::ReduceOp;
use kolo_threads::{communicators, Collectives, ThreadComm, TransportError};
use kolo_transport::{Generic, Scale};
use std::thread;
use std::time::{Duration, Instant};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Per-iteration times on one rank.
fn time_rank<C: Collectives>(
    comm: &mut C,
    bytes: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<Duration>, TransportError> {
    let mut buf = vec![1.0f32; bytes / 4];
    for _ in 0..warmup {
        comm.allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)?;
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        comm.barrier()?;
        let start = Instant::now();
        comm.allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)?;
        times.push(start.elapsed());
    }
    Ok(times)
}

/// Per-iteration times (slowest rank) of `iters` allreduces of `bytes`.
fn measure(
    ranks: usize,
    generic: bool,
    bytes: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let comms = communicators(ranks)?;
    let per_rank = thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm: ThreadComm| {
                s.spawn(move || {
                    if generic {
                        time_rank(&mut Generic(comm), bytes, warmup, iters)
                    } else {
                        let mut comm = comm;
                        time_rank(&mut comm, bytes, warmup, iters)
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| "a rank panicked".to_string())?
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, String>>()
    })?;
    Ok((0..iters)
        .map(|i| per_rank.iter().map(|t| t[i]).max().unwrap_or_default())
        .collect())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let generic = args.iter().any(|a| a == "--generic");
    let ranks: usize = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or(Ok(2), |a| a.parse())?;
    let which = if generic {
        "generic ring over send/recv"
    } else {
        "shared memory"
    };
    println!("{ranks} ranks, f32 sum allreduce, {which}");
    if args.iter().any(|a| a == "--sweep") {
        for shift in 8..=20 {
            let bytes = 1usize << shift;
            let time = median(measure(ranks, generic, bytes, 200, 2_000)?);
            println!(
                "  {:>7} B: median {:.2} us",
                bytes,
                time.as_secs_f64() * 1e6
            );
        }
        return Ok(());
    }
    let small = median(measure(ranks, generic, 8, 2_000, 20_000)?);
    println!("  8 B: median {:.2} us", small.as_secs_f64() * 1e6);
    for (mib, iters) in [(16, 40), (64, 15)] {
        let bytes = mib << 20;
        let time = median(measure(ranks, generic, bytes, 3, iters)?);
        let busbw = bytes as f64 / time.as_secs_f64() * 2.0 * (ranks as f64 - 1.0) / ranks as f64;
        println!(
            "  {mib} MiB: median {:.2} ms, busbw {:.2} GB/s",
            time.as_secs_f64() * 1e3,
            busbw / 1e9
        );
    }
    Ok(())
}
