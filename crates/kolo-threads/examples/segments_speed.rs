//! A quick speed check of `allreduce_segments` (not a benchmark suite; see
//! `kolo-bench` for that): f32 sum of 1,000 tensors of 1,024 elements
//! (4 MB in all) on 2 ranks (or the count given as the first argument),
//! three ways in turn, median time of the slowest rank:
//!
//! - `segments`: one `allreduce_segments` straight over the tensors;
//! - `pack`: copy the tensors into one buffer, `allreduce` it, copy back
//!   (what a fused allreduce costs where the backend cannot reduce
//!   segments in place; single-threaded copies);
//! - `allreduce`: one `allreduce` of an already packed 4 MB buffer (the
//!   floor of both).
//!
//! `cargo run --release -p kolo-threads --example segments_speed [ranks]`

use kolo_protocol::ReduceOp;
use kolo_threads::{Collectives, ThreadComm, TransportError};
use kolo_transport::Scale;
use std::time::{Duration, Instant};

const TENSORS: usize = 1000;
const ELEMENTS: usize = 1024;
const WARMUP: usize = 10;
const ITERS: usize = 200;

#[derive(Clone, Copy, Debug)]
enum Way {
    Segments,
    Pack,
    Allreduce,
}

const WAYS: [Way; 3] = [Way::Segments, Way::Pack, Way::Allreduce];

fn once(
    comm: &mut ThreadComm,
    way: Way,
    tensors: &mut [Vec<f32>],
    packed: &mut [f32],
) -> Result<(), TransportError> {
    match way {
        Way::Segments => {
            let mut views: Vec<&mut [f32]> = tensors.iter_mut().map(Vec::as_mut_slice).collect();
            comm.allreduce_segments(&mut views, ReduceOp::Sum, Scale::NONE)
        }
        Way::Pack => {
            for (chunk, tensor) in packed.chunks_mut(ELEMENTS).zip(tensors.iter()) {
                chunk.copy_from_slice(tensor);
            }
            comm.allreduce(packed, ReduceOp::Sum, Scale::NONE)?;
            for (chunk, tensor) in packed.chunks(ELEMENTS).zip(tensors.iter_mut()) {
                tensor.copy_from_slice(chunk);
            }
            Ok(())
        }
        Way::Allreduce => comm.allreduce(packed, ReduceOp::Sum, Scale::NONE),
    }
}

/// Per-iteration times of every way on one rank, the ways interleaved.
fn time_rank(comm: &mut ThreadComm) -> Result<Vec<Vec<Duration>>, TransportError> {
    let mut tensors = vec![vec![0.0f32; ELEMENTS]; TENSORS];
    let mut packed = vec![0.0f32; TENSORS * ELEMENTS];
    let mut times = vec![Vec::with_capacity(ITERS); WAYS.len()];
    for iter in 0..WARMUP + ITERS {
        for (w, &way) in WAYS.iter().enumerate() {
            comm.barrier()?;
            let start = Instant::now();
            once(comm, way, &mut tensors, &mut packed)?;
            if iter >= WARMUP {
                times[w].push(start.elapsed());
            }
        }
    }
    Ok(times)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ranks = std::env::args()
        .nth(1)
        .map(|a| a.parse::<usize>())
        .transpose()?
        .unwrap_or(2);
    let per_rank = kolo_threads::run(ranks, time_rank)?;
    println!("{TENSORS} tensors of {ELEMENTS} f32 (4 MB) on {ranks} ranks, median of {ITERS}:");
    for (w, way) in WAYS.iter().enumerate() {
        let mut slowest: Vec<Duration> = (0..ITERS)
            .map(|i| per_rank.iter().map(|t| t[w][i]).max().unwrap_or_default())
            .collect();
        slowest.sort();
        println!(
            "  {way:?}: {:.1} us",
            slowest[ITERS / 2].as_secs_f64() * 1e6
        );
    }
    Ok(())
}
