//! What one invocation measures, independent of how the ranks run.

use crate::op::{BenchOp, Layout};
use kolo_protocol::{DataType, ReduceOp};

/// The sweep every rank runs: the same on all of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The collectives, in order.
    pub ops: Vec<BenchOp>,
    pub dtype: DataType,
    /// The reduction of allreduce and reduce-scatter.
    pub redop: ReduceOp,
    /// Requested sizes in bytes (see [`crate::size::sweep`]).
    pub sizes: Vec<usize>,
    /// Timed iterations per size (at least 1).
    pub iters: usize,
    /// Untimed iterations before them.
    pub warmup: usize,
    /// Whether the last iteration's result is checked.
    pub check: bool,
    /// Also time a plain `MPI_Allreduce` on identical buffers in every
    /// allreduce iteration (mpi backend, direct mode; see `crate::baseline`).
    pub baseline: bool,
}

impl Plan {
    /// The distinct layouts of `op` over the sweep on `ranks` ranks, in
    /// order: requested sizes that round to the same buffers (tiny sizes
    /// over many ranks) are measured once.
    pub fn layouts(&self, op: BenchOp, ranks: usize) -> Vec<Layout> {
        let mut layouts: Vec<Layout> = Vec::with_capacity(self.sizes.len());
        for &bytes in &self.sizes {
            let layout = op.layout(bytes, self.dtype.size(), ranks);
            if layouts.last() != Some(&layout) {
                layouts.push(layout);
            }
        }
        layouts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_drop_sizes_that_round_alike() {
        let plan = Plan {
            ops: vec![BenchOp::Allgather],
            dtype: DataType::F32,
            redop: ReduceOp::Sum,
            sizes: vec![8, 16, 32, 64],
            iters: 1,
            warmup: 0,
            check: true,
            baseline: false,
        };
        // 4 ranks x 4 bytes: 8 and 16 both become one element per rank.
        let bytes: Vec<usize> = plan
            .layouts(BenchOp::Allgather, 4)
            .iter()
            .map(|l| l.bytes)
            .collect();
        assert_eq!(bytes, vec![16, 32, 64]);
        let bytes: Vec<usize> = plan
            .layouts(BenchOp::Allreduce, 4)
            .iter()
            .map(|l| l.bytes)
            .collect();
        assert_eq!(bytes, vec![8, 16, 32, 64]);
    }
}
