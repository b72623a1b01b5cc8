//! The element reduction kernels at 1 MiB per buffer: `reduce_into`
//! (acc += src) and `reduce_many` over 2 and 4 sources, for f32, bf16 and
//! i32 sums. Throughput counts the source bytes read (2 or 4 MiB per call),
//! so GB/s compares across source counts and dtypes; a vectorized kernel
//! runs at several GB/s, a scalar one (or bf16 converted element by
//! element) far below.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use kolo_protocol::ReduceOp;
use kolo_transport::Element;
use std::hint::black_box;

const BYTES: usize = 1 << 20;

fn sources<T: Element>(k: usize) -> Vec<Vec<T>> {
    let len = BYTES / std::mem::size_of::<T>();
    (0..k)
        .map(|s| {
            (0..len)
                .map(|i| T::from_f64(((i * 3 + s * 7) % 5) as f64))
                .collect()
        })
        .collect()
}

fn bench_type<T: Element>(c: &mut Criterion) {
    let name = T::DTYPE.name();
    let mut group = c.benchmark_group(format!("sum/{name}"));

    let srcs = sources::<T>(2);
    let mut acc = srcs[0].clone();
    group.throughput(Throughput::Bytes(2 * BYTES as u64));
    group.bench_function("reduce_into", |b| {
        b.iter(|| T::reduce_into(black_box(&mut acc), black_box(&srcs[1]), ReduceOp::Sum))
    });

    for k in [2usize, 4] {
        let srcs = sources::<T>(k);
        let views: Vec<&[T]> = srcs.iter().map(Vec::as_slice).collect();
        let mut dst = vec![T::default(); srcs[0].len()];
        group.throughput(Throughput::Bytes((k * BYTES) as u64));
        group.bench_with_input(BenchmarkId::new("reduce_many", k), &views, |b, views| {
            b.iter(|| T::reduce_many(black_box(&mut dst), black_box(views), ReduceOp::Sum))
        });
    }
    group.finish();
}

fn kernels(c: &mut Criterion) {
    bench_type::<f32>(c);
    bench_type::<bf16>(c);
    bench_type::<i32>(c);
}

criterion_group!(benches, kernels);
criterion_main!(benches);
