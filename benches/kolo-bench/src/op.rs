//! The collectives the tool measures, how a sweep size maps onto their
//! buffers, and nccl-tests' bus-bandwidth factors.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One benchmarked collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchOp {
    /// In place, every rank's buffer reduced into every rank's buffer.
    Allreduce,
    /// Every rank's block concatenated on every rank.
    Allgather,
    /// Rank 0's buffer copied to every rank.
    Broadcast,
    /// The reduction of every rank's array, block `rank` kept on each rank.
    Reducescatter,
    /// Block p of every rank's array sent to rank p.
    Alltoall,
    /// Ring pattern: rank r sends to r+1 and receives from r-1.
    Sendrecv,
}

impl BenchOp {
    /// Every op, in the order `--op all` runs them.
    pub const ALL: [BenchOp; 6] = [
        BenchOp::Allreduce,
        BenchOp::Allgather,
        BenchOp::Broadcast,
        BenchOp::Reducescatter,
        BenchOp::Alltoall,
        BenchOp::Sendrecv,
    ];

    /// The name used in flags, the table and the JSON rows.
    pub const fn name(self) -> &'static str {
        match self {
            BenchOp::Allreduce => "allreduce",
            BenchOp::Allgather => "allgather",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reducescatter => "reducescatter",
            BenchOp::Alltoall => "alltoall",
            BenchOp::Sendrecv => "sendrecv",
        }
    }

    /// True for the ops that reduce (and so use `--redop`).
    pub const fn reduces(self) -> bool {
        matches!(self, BenchOp::Allreduce | BenchOp::Reducescatter)
    }

    /// nccl-tests' factor from algorithm bandwidth to bus bandwidth with `n`
    /// ranks: `2(n-1)/n` for allreduce, `(n-1)/n` for allgather,
    /// reduce-scatter and alltoall (whose size is the whole gathered array),
    /// 1 for broadcast and send/recv.
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            BenchOp::Allreduce => 2.0 * (n - 1.0) / n,
            BenchOp::Allgather | BenchOp::Reducescatter | BenchOp::Alltoall => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::Sendrecv => 1.0,
        }
    }

    /// The buffers for a sweep size of `bytes` with elements of
    /// `elem_size` bytes over `n` ranks (see [`Layout`]).
    pub fn layout(self, bytes: usize, elem_size: usize, n: usize) -> Layout {
        let elem_size = elem_size.max(1);
        let n = n.max(1);
        match self {
            BenchOp::Allreduce | BenchOp::Broadcast | BenchOp::Sendrecv => {
                let count = (bytes / elem_size).max(1);
                Layout {
                    count,
                    block: count,
                    send: count,
                    recv: count,
                    bytes: count * elem_size,
                }
            }
            BenchOp::Allgather | BenchOp::Reducescatter | BenchOp::Alltoall => {
                let block = (bytes / (elem_size * n)).max(1);
                let count = block * n;
                let (send, recv) = match self {
                    BenchOp::Allgather => (block, count),
                    BenchOp::Reducescatter => (count, block),
                    _ => (count, count),
                };
                Layout {
                    count,
                    block,
                    send,
                    recv,
                    bytes: count * elem_size,
                }
            }
        }
    }
}

impl fmt::Display for BenchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How one sweep size is laid out for one op: nccl-tests' convention, where
/// the reported size of allgather, reduce-scatter and alltoall is the whole
/// array (every rank's block), rounded down to a multiple of `n` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Elements of the reported array (the `count` column).
    pub count: usize,
    /// Elements per rank block (`count / n` for the gathered ops, `count`
    /// otherwise).
    pub block: usize,
    /// Elements of each rank's send buffer (the in-place buffer for
    /// allreduce and broadcast).
    pub send: usize,
    /// Elements of each rank's receive buffer.
    pub recv: usize,
    /// The reported size in bytes (the `size` column, `count * elem_size`).
    pub bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn busbw_factors_follow_nccl_tests() {
        assert_eq!(BenchOp::Allreduce.busbw_factor(2), 1.0);
        assert_eq!(BenchOp::Allreduce.busbw_factor(4), 1.5);
        assert_eq!(BenchOp::Allreduce.busbw_factor(8), 1.75);
        for op in [
            BenchOp::Allgather,
            BenchOp::Reducescatter,
            BenchOp::Alltoall,
        ] {
            assert_eq!(op.busbw_factor(2), 0.5);
            assert_eq!(op.busbw_factor(4), 0.75);
        }
        for op in [BenchOp::Broadcast, BenchOp::Sendrecv] {
            assert_eq!(op.busbw_factor(2), 1.0);
            assert_eq!(op.busbw_factor(8), 1.0);
        }
        assert_eq!(BenchOp::Allreduce.busbw_factor(1), 0.0);
    }

    #[test]
    fn layouts_of_16_mib_f32_on_4_ranks() {
        let mib16 = 16 << 20;
        let ar = BenchOp::Allreduce.layout(mib16, 4, 4);
        assert_eq!(
            (ar.count, ar.send, ar.recv, ar.bytes),
            (4 << 20, 4 << 20, 4 << 20, mib16)
        );
        let ag = BenchOp::Allgather.layout(mib16, 4, 4);
        assert_eq!(
            (ag.count, ag.block, ag.send, ag.recv),
            (4 << 20, 1 << 20, 1 << 20, 4 << 20)
        );
        let rs = BenchOp::Reducescatter.layout(mib16, 4, 4);
        assert_eq!((rs.send, rs.recv), (4 << 20, 1 << 20));
        let a2a = BenchOp::Alltoall.layout(mib16, 4, 4);
        assert_eq!((a2a.send, a2a.recv, a2a.block), (4 << 20, 4 << 20, 1 << 20));
    }

    #[test]
    fn tiny_sizes_round_up_to_one_element_per_rank() {
        let ag = BenchOp::Allgather.layout(8, 4, 4);
        assert_eq!((ag.block, ag.count, ag.bytes), (1, 4, 16));
        let ar = BenchOp::Allreduce.layout(1, 8, 2);
        assert_eq!((ar.count, ar.bytes), (1, 8));
    }

    #[test]
    fn names_are_unique_and_lowercase() {
        let names: Vec<_> = BenchOp::ALL.iter().map(|op| op.name()).collect();
        for (i, name) in names.iter().enumerate() {
            assert_eq!(name.to_lowercase(), *name);
            assert!(!names[i + 1..].contains(name));
            assert_eq!(
                serde_json::to_string(&BenchOp::ALL[i]).unwrap(),
                format!("\"{name}\"")
            );
        }
    }

    proptest! {
        #[test]
        fn layout_is_consistent(bytes in 1usize..1 << 30, elem in prop::sample::select(vec![1usize, 2, 4, 8]), n in 1usize..17) {
            for op in BenchOp::ALL {
                let l = op.layout(bytes, elem, n);
                prop_assert_eq!(l.bytes, l.count * elem);
                prop_assert!(l.count >= 1 && l.block >= 1);
                // Never more than asked, unless asked for less than one element per rank.
                prop_assert!(l.bytes <= bytes || l.block == 1);
                match op {
                    BenchOp::Allgather | BenchOp::Reducescatter | BenchOp::Alltoall => {
                        prop_assert_eq!(l.count, l.block * n);
                        prop_assert_eq!(l.send.max(l.recv), l.count);
                        prop_assert_eq!(l.send.min(l.recv), if op == BenchOp::Alltoall { l.count } else { l.block });
                    }
                    _ => prop_assert!(l.send == l.count && l.recv == l.count),
                }
            }
        }
    }
}
