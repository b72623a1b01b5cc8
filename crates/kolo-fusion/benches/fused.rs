//! What fusion costs on the host, apart from the collective: fused
//! allreduce, allgather and reduce-scatter on one rank whose collectives
//! do no work (the allreduce leaves the buffer as it is, the others copy
//! the send buffer), so the times are the fusion buffer's lookup, the
//! copies in and out and the per-tensor bookkeeping. Sizes below and above
//! [`kolo_fusion::PARALLEL_COPY_BYTES`] take the sequential and the rayon
//! copies.

use kolo_fusion::{fused_allgather, fused_allreduce, fused_reduce_scatter, FusionBuffers};
use kolo_protocol::{Device, ReduceOp};
use kolo_transport::{Collectives, Element, Result, Scale, Topology, TransportError};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// One rank with collectives that move nothing between ranks.
struct Solo;

impl Topology for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn local_rank(&self) -> usize {
        0
    }
    fn local_size(&self) -> usize {
        1
    }
}

fn no_messages() -> TransportError {
    TransportError::Unsupported("the bench's backend sends no messages".into())
}

impl Collectives for Solo {
    fn send<T: Element>(&mut self, _: &[T], _: usize, _: u32) -> Result<()> {
        Err(no_messages())
    }
    fn recv<T: Element>(&mut self, _: &mut [T], _: usize, _: u32) -> Result<()> {
        Err(no_messages())
    }
    fn allreduce<T: Element>(&mut self, buf: &mut [T], _: ReduceOp, _: Scale) -> Result<()> {
        black_box(buf);
        Ok(())
    }
    fn allgatherv<T: Element>(&mut self, send: &[T], recv: &mut [T], _: &[usize]) -> Result<()> {
        recv.copy_from_slice(send);
        Ok(())
    }
    fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        _: &[usize],
        _: ReduceOp,
        _: Scale,
    ) -> Result<()> {
        recv.copy_from_slice(send);
        Ok(())
    }
}

/// (tensors, f32 elements per tensor): many tiny tensors, a sequential
/// copy of 1 MiB, a parallel copy of 16 MiB.
const SHAPES: [(usize, usize); 3] = [(1024, 16), (64, 4096), (64, 65_536)];

fn tensors(count: usize, len: usize) -> Vec<Vec<f32>> {
    (0..count)
        .map(|t| (0..len).map(|i| (t + i) as f32).collect())
        .collect()
}

/// Runs `f` in batches of about 10 ms for `samples` batches after a warm-up
/// and prints the median time per call (and the bytes per second moved in
/// and out of the fusion buffer: twice `bytes`).
fn measure(name: &str, bytes: usize, samples: usize, mut f: impl FnMut()) {
    let warm_up = Instant::now();
    let mut calls = 0u64;
    while warm_up.elapsed() < Duration::from_millis(200) {
        f();
        calls += 1;
    }
    let per_batch = (calls * 10 / 200).max(1);
    let mut times: Vec<f64> = (0..samples)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            start.elapsed().as_secs_f64() / per_batch as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "{name:<40} median {:>10.1} us  {:>6.2} GB/s copied",
        median * 1e6,
        2.0 * bytes as f64 / median / 1e9
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument picks cases by name.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let samples = 31;
    for (count, len) in SHAPES {
        let bytes = count * len * std::mem::size_of::<f32>();
        let mut bufs = FusionBuffers::new();

        let name = format!("fused_allreduce/{count}x{len}");
        if wanted(&name) {
            let mut data = tensors(count, len);
            measure(&name, bytes, samples, || {
                let mut views: Vec<&mut [f32]> = data.iter_mut().map(Vec::as_mut_slice).collect();
                let result = fused_allreduce(
                    &mut Solo,
                    &mut bufs,
                    Device::Cpu,
                    &mut views,
                    ReduceOp::Sum,
                    Scale::NONE,
                    &mut |_, _| {},
                );
                black_box(result).expect("the bench's layout is valid");
            });
        }

        let name = format!("fused_allgather/{count}x{len}");
        if wanted(&name) {
            let data = tensors(count, len);
            let rows = vec![1; count];
            let first_dims = vec![len as u64; count];
            measure(&name, bytes, samples, || {
                let views: Vec<&[f32]> = data.iter().map(Vec::as_slice).collect();
                let result = fused_allgather(
                    &mut Solo,
                    &mut bufs,
                    Device::Cpu,
                    &views,
                    &rows,
                    &first_dims,
                    &mut |_, _| {},
                );
                black_box(result).expect("the bench's layout is valid");
            });
        }

        let name = format!("fused_reduce_scatter/{count}x{len}");
        if wanted(&name) {
            let data = tensors(count, len);
            let mut outs = tensors(count, len);
            let counts = vec![vec![len]; count];
            measure(&name, bytes, samples, || {
                let views: Vec<&[f32]> = data.iter().map(Vec::as_slice).collect();
                let mut out_views: Vec<&mut [f32]> =
                    outs.iter_mut().map(Vec::as_mut_slice).collect();
                let result = fused_reduce_scatter(
                    &mut Solo,
                    &mut bufs,
                    Device::Cpu,
                    &views,
                    &mut out_views,
                    &counts,
                    ReduceOp::Sum,
                    Scale::NONE,
                    &mut |_, _| {},
                );
                black_box(result).expect("the bench's layout is valid");
            });
        }
    }
}
