//! Timed operations on device buffers, for kolo-bench's NCCL mode (both
//! modes: build the [`NcclComm`] however, then call [`time_op`] on every
//! rank). Bandwidths follow nccl-tests (see `ANCHORS.md`).

use crate::comm::NcclComm;
use crate::error::NcclError;
use cudarc::driver::sys::CUevent_flags;
use kolo_protocol::ReduceOp;
use kolo_transport::{Scale, Topology};
use std::time::Duration;

/// The operations [`time_op`] measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchOp {
    /// In-place f32 sum allreduce of the whole buffer.
    AllReduce,
    /// Even all-gather; the size is the gathered array.
    AllGather,
    /// Even reduce-scatter (sum); the size is the input array.
    ReduceScatter,
    /// Broadcast from rank 0.
    Broadcast,
    /// Ring exchange: send to rank + 1, receive from rank - 1.
    SendRecv,
    /// Even all-to-all; the size is each rank's send buffer.
    AllToAll,
}

impl BenchOp {
    /// Every operation.
    pub const ALL: [BenchOp; 6] = [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::Broadcast,
        BenchOp::SendRecv,
        BenchOp::AllToAll,
    ];

    /// nccl-tests' name.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Broadcast => "broadcast",
            BenchOp::SendRecv => "sendrecv",
            BenchOp::AllToAll => "alltoall",
        }
    }

    /// busbw / algbw on `ranks` ranks: 2(n-1)/n for allreduce, (n-1)/n for
    /// all-gather, reduce-scatter and all-to-all, 1 otherwise.
    pub fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks.max(1) as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::SendRecv => 1.0,
        }
    }
}

/// One measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BenchResult {
    /// The operation.
    pub op: BenchOp,
    /// Bytes of the measured array (rounded down to whole f32 blocks).
    pub bytes: usize,
    /// Timed iterations.
    pub iters: usize,
    /// GPU time per iteration (between events on the communication stream).
    pub time: Duration,
    /// bytes / time, in GB/s (1e9 bytes).
    pub algbw: f64,
    /// algbw times [`BenchOp::bus_factor`].
    pub busbw: f64,
}

/// Elements of f32 for `bytes` of `op` on `n` ranks: divisible by `n`
/// where the operation splits the array, at least one block.
pub fn elements_for(op: BenchOp, bytes: usize, n: usize) -> usize {
    let n = n.max(1);
    let elements = (bytes / 4).max(1);
    match op {
        BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll => {
            (elements / n).max(1) * n
        }
        _ => elements,
    }
}

/// Times `iters` back-to-back runs of `op` on about `bytes` of f32 after
/// `warmup` untimed runs. Collective: every rank calls it with the same
/// arguments. The time is measured on the GPU between two timing events on
/// the communication stream.
pub fn time_op(
    comm: &mut NcclComm,
    op: BenchOp,
    bytes: usize,
    warmup: usize,
    iters: usize,
) -> Result<BenchResult, NcclError> {
    let n = comm.size();
    let elements = elements_for(op, bytes, n);
    let stream = comm.stream().clone();
    let alloc = |len: usize| {
        stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(NcclError::on_cuda("cuMemAllocAsync"))
    };
    let mut a = alloc(elements)?;
    let mut b = alloc(elements)?;
    let (rank, right, left) = (
        comm.rank(),
        (comm.rank() + 1) % n,
        (comm.rank() + n - 1) % n,
    );
    let block = elements / n;
    let counts = vec![block; n];
    let mut once = |comm: &mut NcclComm| -> Result<crate::Work, NcclError> {
        match op {
            BenchOp::AllReduce => comm.all_reduce(&mut a, ReduceOp::Sum, Scale::NONE),
            BenchOp::AllGather => {
                comm.all_gather(&a.slice(rank * block..(rank + 1) * block), &mut b)
            }
            BenchOp::ReduceScatter => comm.reduce_scatter(
                &a,
                &mut b.slice_mut(..block),
                &counts,
                ReduceOp::Sum,
                Scale::NONE,
            ),
            BenchOp::Broadcast => comm.broadcast(&mut a, 0),
            BenchOp::SendRecv if n == 1 => comm.flush(),
            BenchOp::SendRecv => comm.send_recv(&a, right, &mut b, left),
            BenchOp::AllToAll => comm.all_to_allv(&a, &counts, &mut b, &counts),
        }
    };
    for _ in 0..warmup {
        once(comm)?;
    }
    let ctx = comm.device().context().clone();
    let start = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(NcclError::on_cuda("cuEventCreate"))?;
    let end = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(NcclError::on_cuda("cuEventCreate"))?;
    start
        .record(&stream)
        .map_err(NcclError::on_cuda("cuEventRecord"))?;
    let mut last = None;
    for _ in 0..iters {
        last = Some(once(comm)?);
    }
    end.record(&stream)
        .map_err(NcclError::on_cuda("cuEventRecord"))?;
    if let Some(work) = last {
        work.wait()?;
    }
    let ms = start
        .elapsed_ms(&end)
        .map_err(NcclError::on_cuda("cuEventElapsedTime"))?;
    let time = Duration::from_secs_f64(f64::from(ms) / 1e3 / iters.max(1) as f64);
    let bytes = elements * 4;
    let algbw = bytes as f64 / time.as_secs_f64().max(1e-12) / 1e9;
    Ok(BenchResult {
        op,
        bytes,
        iters,
        time,
        algbw,
        busbw: algbw * op.bus_factor(n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(BenchOp::AllReduce.bus_factor(2), 1.0);
        assert_eq!(BenchOp::AllReduce.bus_factor(4), 1.5);
        assert_eq!(BenchOp::AllGather.bus_factor(4), 0.75);
        assert_eq!(BenchOp::Broadcast.bus_factor(8), 1.0);
        assert_eq!(BenchOp::AllToAll.bus_factor(1), 0.0);
    }

    #[test]
    fn element_counts_split_evenly() {
        assert_eq!(elements_for(BenchOp::AllReduce, 8, 3), 2);
        assert_eq!(elements_for(BenchOp::AllGather, 40, 3), 9);
        assert_eq!(elements_for(BenchOp::ReduceScatter, 4, 4), 4);
        assert_eq!(elements_for(BenchOp::Broadcast, 0, 2), 1);
        let names: Vec<_> = BenchOp::ALL.iter().map(|o| o.name()).collect();
        assert_eq!(
            names,
            [
                "all_reduce",
                "all_gather",
                "reduce_scatter",
                "broadcast",
                "sendrecv",
                "alltoall"
            ]
        );
    }
}
