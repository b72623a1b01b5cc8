//! The fused operations driven as a device backend drives them: written
//! once over a memory `M` (inputs made with `buffer_from`, outputs with
//! `new_buffer`, results read back with `read_buffer` after
//! `synchronize`), instantiated here on host memory over the threads
//! backend (in-place segments), the same through `Generic` (the pack
//! path), and a backend that counts the allocations and copies fusion asks
//! of it. Random layouts check where every tensor's pieces land.

use kolo_fusion::{
    fused_allgather, fused_allreduce, fused_reduce_scatter, Edge, FusionBuffers, FusionError, Phase,
};
use kolo_protocol::{Device, ReduceOp};
use kolo_transport::{Collectives, Element, Generic, Host, Memory, Scale, Topology};
use proptest::prelude::*;

fn ignore(_: Phase, _: Edge) {}

/// Small integers (exact in f64 sums and products) that differ per rank,
/// tensor and element.
fn value(rank: usize, tensor: usize, i: usize) -> f64 {
    ((rank * 7 + tensor * 3 + i) % 5) as f64 - 2.0
}

fn values(rank: usize, tensor: usize, len: usize) -> Vec<f64> {
    (0..len).map(|i| value(rank, tensor, i)).collect()
}

fn reduce(op: ReduceOp, values: impl Iterator<Item = f64>) -> f64 {
    let values: Vec<f64> = values.collect();
    match op {
        ReduceOp::Sum => values.iter().sum(),
        ReduceOp::Average => values.iter().sum::<f64>() / values.len() as f64,
        ReduceOp::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Product => values.iter().product(),
    }
}

const SCALE: Scale = Scale {
    prescale: 2.0,
    postscale: 0.5,
};

/// The elements of every buffer, on the host, once the backend is done.
fn read_all<M: Memory, C: Collectives<M>>(
    comm: &mut C,
    owned: &[M::Owned<f64>],
) -> Result<Vec<Vec<f64>>, FusionError> {
    comm.synchronize()?;
    let mut out = Vec::with_capacity(owned.len());
    for buf in owned {
        out.push(comm.read_buffer(M::view(buf))?);
    }
    Ok(out)
}

/// This rank's tensors of `lens` in memory `M`, allreduced fused.
fn allreduce_over<M: Memory, C: Collectives<M>>(
    comm: &mut C,
    bufs: &mut FusionBuffers<M>,
    lens: &[usize],
    op: ReduceOp,
) -> Result<Vec<Vec<f64>>, FusionError> {
    let rank = comm.rank();
    let mut owned = Vec::with_capacity(lens.len());
    for (t, &len) in lens.iter().enumerate() {
        owned.push(comm.buffer_from(&values(rank, t, len))?);
    }
    let mut views: Vec<M::Mut<'_, f64>> = owned.iter_mut().map(M::view_mut).collect();
    fused_allreduce(comm, bufs, Device::Cpu, &mut views, op, SCALE, &mut ignore)?;
    drop(views);
    read_all(comm, &owned)
}

/// This rank's rows of every tensor in memory `M`, gathered fused: tensor
/// t has `rows[t]` elements per row and `first_dims[t * size + r]` rows on
/// rank r; rank r's element i of tensor t is `value(r, t, i)`.
fn allgather_over<M: Memory, C: Collectives<M>>(
    comm: &mut C,
    bufs: &mut FusionBuffers<M>,
    rows: &[usize],
    first_dims: &[u64],
) -> Result<Vec<Vec<f64>>, FusionError> {
    let (rank, size) = (comm.rank(), comm.size());
    let mut owned = Vec::with_capacity(rows.len());
    for (t, &row) in rows.iter().enumerate() {
        let len = first_dims[t * size + rank] as usize * row;
        owned.push(comm.buffer_from(&values(rank, t, len))?);
    }
    let views: Vec<M::Ref<'_, f64>> = owned.iter().map(M::view).collect();
    let gathered = fused_allgather(
        comm,
        bufs,
        Device::Cpu,
        &views,
        rows,
        first_dims,
        &mut ignore,
    )?;
    read_all(comm, &gathered)
}

/// Every rank's tensors of `sum(counts[t])` elements in memory `M`,
/// reduce-scattered fused: this rank keeps `counts[t][rank]` of tensor t.
fn reduce_scatter_over<M: Memory, C: Collectives<M>>(
    comm: &mut C,
    bufs: &mut FusionBuffers<M>,
    counts: &[Vec<usize>],
    op: ReduceOp,
) -> Result<Vec<Vec<f64>>, FusionError> {
    let rank = comm.rank();
    let mut inputs = Vec::with_capacity(counts.len());
    let mut outputs = Vec::with_capacity(counts.len());
    for (t, tensor_counts) in counts.iter().enumerate() {
        inputs.push(comm.buffer_from(&values(rank, t, tensor_counts.iter().sum()))?);
        outputs.push(comm.new_buffer::<f64>(tensor_counts[rank])?);
    }
    let in_views: Vec<M::Ref<'_, f64>> = inputs.iter().map(M::view).collect();
    let mut out_views: Vec<M::Mut<'_, f64>> = outputs.iter_mut().map(M::view_mut).collect();
    fused_reduce_scatter(
        comm,
        bufs,
        Device::Cpu,
        &in_views,
        &mut out_views,
        counts,
        op,
        SCALE,
        &mut ignore,
    )?;
    drop(out_views);
    read_all(comm, &outputs)
}

/// A host backend that counts what fusion asks of it beyond the
/// collectives: allocations, packs and unpacks (the hooks a device
/// memory's backend implements), forwarding everything to `inner`.
struct Counting<C> {
    inner: C,
    allocations: usize,
    packs: usize,
    unpacks: usize,
}

impl<C> Counting<C> {
    fn new(inner: C) -> Self {
        Counting {
            inner,
            allocations: 0,
            packs: 0,
            unpacks: 0,
        }
    }
}

impl<C: Topology> Topology for Counting<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn local_size(&self) -> usize {
        self.inner.local_size()
    }
}

impl<C: Collectives> Collectives for Counting<C> {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> kolo_transport::Result<()> {
        self.inner.send(buf, peer, tag)
    }
    fn recv<T: Element>(
        &mut self,
        buf: &mut [T],
        peer: usize,
        tag: u32,
    ) -> kolo_transport::Result<()> {
        self.inner.recv(buf, peer, tag)
    }
    fn allreduce<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        scale: Scale,
    ) -> kolo_transport::Result<()> {
        self.inner.allreduce(buf, op, scale)
    }
    fn allgatherv<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> kolo_transport::Result<()> {
        self.inner.allgatherv(send, recv, counts)
    }
    fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> kolo_transport::Result<()> {
        self.inner.reduce_scatter(send, recv, counts, op, scale)
    }
    fn new_buffer<T: Element>(&mut self, len: usize) -> kolo_transport::Result<Vec<T>> {
        self.allocations += 1;
        self.inner.new_buffer(len)
    }
    fn pack_into<T: Element>(
        &mut self,
        srcs: &[&[T]],
        dst: &mut [T],
    ) -> kolo_transport::Result<()> {
        self.packs += 1;
        self.inner.pack_into(srcs, dst)
    }
    fn unpack_from<T: Element>(
        &mut self,
        src: &[T],
        dsts: &mut [&mut [T]],
    ) -> kolo_transport::Result<()> {
        self.unpacks += 1;
        self.inner.unpack_from(src, dsts)
    }
}

fn expected_allreduce(n: usize, lens: &[usize], op: ReduceOp) -> Vec<Vec<f64>> {
    lens.iter()
        .enumerate()
        .map(|(t, &len)| {
            (0..len)
                .map(|i| reduce(op, (0..n).map(|r| 2.0 * value(r, t, i))) * 0.5)
                .collect()
        })
        .collect()
}

#[test]
fn generic_allreduce_on_host_memory_matches_the_reference_on_every_path() {
    let lens = [5usize, 0, 1, 33, 8];
    for n in 1..=4 {
        for op in ReduceOp::ALL {
            let results = kolo_threads::run(n, |comm| {
                let mut bufs = FusionBuffers::<Host>::default();
                let in_place = allreduce_over(comm, &mut bufs, &lens, op)?;
                let in_place_bytes = bufs.bytes_allocated();
                let packed = allreduce_over(&mut Generic(&mut *comm), &mut bufs, &lens, op)?;
                Ok::<_, FusionError>((in_place, in_place_bytes, packed, bufs.bytes_allocated()))
            })
            .unwrap();
            let expected = expected_allreduce(n, &lens, op);
            for (in_place, in_place_bytes, packed, bytes) in results {
                assert_eq!(in_place, expected, "in place, n = {n}, op = {op}");
                assert_eq!(in_place_bytes, 0, "in place needs no fusion buffer");
                assert_eq!(packed, expected, "packed, n = {n}, op = {op}");
                let total: usize = lens.iter().sum();
                assert_eq!(bytes, total * 8, "one f64 fusion buffer");
            }
        }
    }
}

#[test]
fn fusion_allocates_and_copies_with_the_backend_and_keeps_its_buffer() {
    let lens = [3usize, 4, 1];
    let rows = [2usize, 1];
    let counts = vec![vec![1usize, 2, 0], vec![2, 2, 1]];
    let results = kolo_threads::run(3, |comm| {
        let mut comm = Counting::new(comm);
        let mut bufs = FusionBuffers::<Host>::default();
        let mut tally = Vec::new();
        let mut mark =
            |comm: &Counting<_>| tally.push((comm.allocations, comm.packs, comm.unpacks));
        // Inputs come from `buffer_from` (the host's copy, not counted).
        let before = comm.allocations;
        let reduced = allreduce_over(&mut comm, &mut bufs, &lens, ReduceOp::Sum)?;
        mark(&comm);
        let again = allreduce_over(&mut comm, &mut bufs, &lens, ReduceOp::Sum)?;
        mark(&comm);
        let gathered = allgather_over(&mut comm, &mut bufs, &rows, &FIRST_DIMS)?;
        mark(&comm);
        let scattered = reduce_scatter_over(&mut comm, &mut bufs, &counts, ReduceOp::Max)?;
        mark(&comm);
        Ok::<_, FusionError>((before, tally, reduced == again, gathered, scattered))
    })
    .unwrap();
    for (rank, (before, tally, same, gathered, scattered)) in results.into_iter().enumerate() {
        assert_eq!(before, 0);
        assert!(same);
        assert_eq!(
            tally,
            [
                // The f64 buffer, one pack, one unpack.
                (1, 1, 1),
                // The buffer is kept: no allocation.
                (1, 2, 2),
                // Fusion's two outputs; the buffer grows to hold this
                // rank's 5 or 2 elements and the 12 gathered.
                (4, 3, 3),
                // The test's two outputs; the fused 8 elements and this
                // rank's 3, 4 or 1 fit the buffer.
                (6, 4, 4),
            ],
            "rank {rank}"
        );
        let rank_rows = |t: usize| (0..3).map(move |r| FIRST_DIMS[t * 3 + r] as usize * rows[t]);
        for (t, tensor) in gathered.iter().enumerate() {
            let expected: Vec<f64> = rank_rows(t)
                .enumerate()
                .flat_map(|(r, len)| values(r, t, len))
                .collect();
            assert_eq!(tensor, &expected, "allgather tensor {t}, rank {rank}");
        }
        for (t, out) in scattered.iter().enumerate() {
            let offset: usize = counts[t][..rank].iter().sum();
            let expected: Vec<f64> = (offset..offset + counts[t][rank])
                .map(|i| reduce(ReduceOp::Max, (0..3).map(|r| 2.0 * value(r, t, i))) * 0.5)
                .collect();
            assert_eq!(out, &expected, "reduce-scatter tensor {t}, rank {rank}");
        }
    }
}

/// The counting test's rows per rank of its two tensors, tensor-major.
const FIRST_DIMS: [u64; 6] = [1, 2, 0, 3, 1, 2];

/// A fused layout for `n` ranks: per tensor, a row length and every rank's
/// row count (allgather), or every rank's block (reduce-scatter).
fn layouts() -> impl Strategy<Value = (usize, Vec<(usize, Vec<usize>)>)> {
    (1usize..=3).prop_flat_map(|n| {
        let tensor = (1usize..4, prop::collection::vec(0usize..4, n));
        (Just(n), prop::collection::vec(tensor, 0..6))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Every rank's rows of every tensor land in rank order in that
    /// tensor's output, on the pack path and on the backend's own, however
    /// the rows fall (empty tensors, ranks without rows).
    #[test]
    fn allgather_places_every_ranks_rows_in_every_layout((n, tensors) in layouts()) {
        let rows: Vec<usize> = tensors.iter().map(|(row, _)| *row).collect();
        let first_dims: Vec<u64> = tensors
            .iter()
            .flat_map(|(_, dims)| dims.iter().map(|&d| d as u64))
            .collect();
        let results = kolo_threads::run(n, |comm| {
            let mut bufs = FusionBuffers::new();
            let packed = allgather_over(&mut Generic(&mut *comm), &mut bufs, &rows, &first_dims)?;
            let native = allgather_over(comm, &mut bufs, &rows, &first_dims)?;
            Ok::<_, FusionError>((packed, native))
        })
        .unwrap();
        for (rank, (packed, native)) in results.into_iter().enumerate() {
            prop_assert_eq!(&packed, &native, "rank {}", rank);
            for (t, (row, dims)) in tensors.iter().enumerate() {
                let expected: Vec<f64> = dims
                    .iter()
                    .enumerate()
                    .flat_map(|(r, &d)| values(r, t, d * row))
                    .collect();
                prop_assert_eq!(&packed[t], &expected, "tensor {}, rank {}", t, rank);
            }
        }
    }

    /// Every rank keeps exactly its block of every tensor, reduced, however
    /// the blocks fall.
    #[test]
    fn reduce_scatter_keeps_each_ranks_block_in_every_layout((n, tensors) in layouts()) {
        let counts: Vec<Vec<usize>> = tensors
            .iter()
            .map(|(row, blocks)| blocks.iter().map(|b| b * row).collect())
            .collect();
        let results = kolo_threads::run(n, |comm| {
            let mut bufs = FusionBuffers::new();
            reduce_scatter_over(&mut Generic(comm), &mut bufs, &counts, ReduceOp::Sum)
        })
        .unwrap();
        for (rank, outputs) in results.into_iter().enumerate() {
            for (t, out) in outputs.iter().enumerate() {
                let offset: usize = counts[t][..rank].iter().sum();
                let expected: Vec<f64> = (offset..offset + counts[t][rank])
                    .map(|i| reduce(ReduceOp::Sum, (0..n).map(|r| 2.0 * value(r, t, i))) * 0.5)
                    .collect();
                prop_assert_eq!(out, &expected, "tensor {}, rank {}", t, rank);
            }
        }
    }

    /// Random tensor lengths, fused allreduce on the pack path equals the
    /// reference.
    #[test]
    fn allreduce_packs_every_layout(
        n in 1usize..=3,
        lens in prop::collection::vec(0usize..40, 0..8),
    ) {
        let results = kolo_threads::run(n, |comm| {
            let mut bufs = FusionBuffers::new();
            allreduce_over(&mut Generic(comm), &mut bufs, &lens, ReduceOp::Sum)
        })
        .unwrap();
        let expected = expected_allreduce(n, &lens, ReduceOp::Sum);
        for (rank, reduced) in results.into_iter().enumerate() {
            prop_assert_eq!(&reduced, &expected, "rank {}", rank);
        }
    }
}
