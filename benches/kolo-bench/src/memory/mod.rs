//! How much memory one rank of a run needs, counted from its plan before
//! anything is allocated, and how much its host has
//! ([`available::Probe`]). Every count is checked: a size whose buffers
//! cannot be counted in 64 bits is an error, never a wrap or a panic.
//!
//! Buffers are freed between sizes, so the need is the largest size's,
//! over every op of the run:
//! - direct mode: the send buffer (none for the in-place allreduce and
//!   broadcast), the receive buffer, twice over for an allreduce timed
//!   next to the plain-MPI baseline;
//! - engine mode: the tool's buffers (receive buffer, allgather's input,
//!   reduce-scatter's and alltoall's staged inputs, gathered outputs), the
//!   engine's copy of the inputs and of the results (none for an
//!   allreduce, reduced in place), and a fusion buffer up to the fusion
//!   threshold;
//! - in both, one more buffer of the larger of send and receive for the
//!   backend's working memory (kolo-threads keeps a reduction scratch of
//!   the buffer's size), the input pattern, and the timings.

pub mod available;

use crate::engine::EngineOptions;
use crate::engine_case::skip_reason;
use crate::op::{BenchOp, Layout};
use crate::plan::Plan;
use crate::reference::Spec;

/// Elements of an input pattern at most ([`crate::buffer::Pattern`]).
const PATTERN_ELEMENTS: u64 = 4096 + 251;
/// Bytes counted per tensor name of engine mode.
const NAME_BYTES: u64 = 64;

/// What a run measures, for counting its buffers.
#[derive(Clone, Copy, Debug)]
pub struct Footprint<'a> {
    pub plan: &'a Plan,
    pub ranks: usize,
    /// Direct mode runs (alone, or first with `--compare`).
    pub direct: bool,
    /// Engine mode runs, with these settings.
    pub engine: Option<&'a EngineOptions>,
}

fn u(n: usize) -> Option<u64> {
    u64::try_from(n).ok()
}

/// `sum(parts) * elem`, checked.
fn bytes_of(parts: &[usize], elem: u64) -> Option<u64> {
    parts
        .iter()
        .try_fold(0u64, |sum, &n| sum.checked_add(u(n)?))?
        .checked_mul(elem)
}

impl Footprint<'_> {
    /// Bytes one rank allocates at its peak; `None` when the count does
    /// not fit in 64 bits.
    pub fn need_per_rank(&self) -> Option<u64> {
        let plan = self.plan;
        let elem = u(plan.dtype.size().max(1))?;
        let ranks = u(self.ranks.max(1))?;
        let mut peak = 0u64;
        for &op in &plan.ops {
            for layout in plan.layouts(op, self.ranks) {
                let spec = Spec {
                    op,
                    dtype: plan.dtype,
                    redop: plan.redop,
                    layout,
                    ranks: self.ranks,
                };
                let mut size = 0u64;
                if self.direct {
                    size = size.max(self.direct_bytes(&spec, elem, ranks)?);
                }
                if let Some(options) = self.engine {
                    size = size.max(engine_bytes(&spec, options, elem)?);
                }
                if size > 0 {
                    let scratch = bytes_of(&[layout.send.max(layout.recv)], elem)?;
                    size = size.checked_add(scratch)?;
                }
                peak = peak.max(size);
            }
        }
        // Every rank's times; rank 0 gathers every rank's.
        let timings = u(plan.iters)?
            .checked_mul(8)?
            .checked_mul(ranks.checked_add(2)?)?;
        peak.checked_add(timings)?
            .checked_add(PATTERN_ELEMENTS.checked_mul(elem)?)
    }

    fn direct_bytes(&self, spec: &Spec, elem: u64, ranks: u64) -> Option<u64> {
        let Layout { send, recv, .. } = spec.layout;
        let send = if in_place(spec.op) { 0 } else { send };
        let case = bytes_of(&[send, recv], elem)?.checked_add(ranks.checked_mul(8)?)?;
        let cases = if self.plan.baseline && spec.op == BenchOp::Allreduce {
            2
        } else {
            1
        };
        case.checked_mul(cases)
    }
}

fn in_place(op: BenchOp) -> bool {
    matches!(op, BenchOp::Allreduce | BenchOp::Broadcast)
}

/// One engine-mode size: the tool's buffers, the engine's copies and its
/// fusion buffer; 0 for sizes engine mode skips.
fn engine_bytes(spec: &Spec, options: &EngineOptions, elem: u64) -> Option<u64> {
    if spec.op == BenchOp::Sendrecv || skip_reason(spec, options.tensors).is_some() {
        return Some(0);
    }
    let Layout { send, recv, .. } = spec.layout;
    let own = match spec.op {
        BenchOp::Allreduce | BenchOp::Broadcast => bytes_of(&[recv], elem)?,
        BenchOp::Allgather | BenchOp::Alltoall => bytes_of(&[send, recv, recv], elem)?,
        BenchOp::Reducescatter => bytes_of(&[send, recv], elem)?,
        BenchOp::Sendrecv => 0,
    };
    // Allreduces work on the tool's buffers in place; the others copy.
    let in_place = spec.op == BenchOp::Allreduce;
    let copies = if in_place {
        0
    } else {
        bytes_of(&[send, recv], elem)?
    };
    let fusion = u(options.config.fusion_threshold.min(spec.layout.bytes))?;
    let names = u(options.tensors)?.checked_mul(NAME_BYTES)?;
    own.checked_add(copies)?
        .checked_add(fusion)?
        .checked_add(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine_case::Submission;
    use kolo_protocol::{DataType, ReduceOp};
    use proptest::prelude::*;

    fn plan(ops: Vec<BenchOp>, max: usize) -> Plan {
        Plan {
            ops,
            dtype: DataType::F32,
            redop: ReduceOp::Sum,
            sizes: crate::size::sweep(8, max, 2).unwrap(),
            iters: 10,
            warmup: 1,
            check: true,
            baseline: false,
        }
    }

    fn engine(grouped: bool) -> EngineOptions {
        EngineOptions {
            tensors: 1,
            submission: Submission {
                grouped,
                ..Submission::default()
            },
            config: kolo::Config::default().fusion_threshold(1 << 20),
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn an_in_place_allreduce_counts_one_buffer_and_the_backends() {
        let plan = plan(vec![BenchOp::Allreduce], 64 << 20);
        let need = Footprint {
            plan: &plan,
            ranks: 2,
            direct: true,
            engine: None,
        }
        .need_per_rank()
        .unwrap();
        // The 64 MiB buffer and the backend's scratch of its size.
        assert!((128 * MIB..128 * MIB + MIB).contains(&need), "{need}");
        let baseline = Plan {
            baseline: true,
            ..plan.clone()
        };
        let need = Footprint {
            plan: &baseline,
            ranks: 2,
            direct: true,
            engine: None,
        }
        .need_per_rank()
        .unwrap();
        assert!((192 * MIB..192 * MIB + MIB).contains(&need), "{need}");
    }

    #[test]
    fn engine_mode_counts_copies_only_where_the_op_copies() {
        let need = |op| {
            let plan = plan(vec![op], 64 << 20);
            let options = engine(false);
            Footprint {
                plan: &plan,
                ranks: 2,
                direct: false,
                engine: Some(&options),
            }
            .need_per_rank()
            .unwrap()
        };
        // Allreduce in place: buffer + scratch + fusion buffer.
        let allreduce = need(BenchOp::Allreduce);
        assert!((129 * MIB..130 * MIB).contains(&allreduce), "{allreduce}");
        // Broadcast copies in and out: + 2 x 64 MiB.
        let broadcast = need(BenchOp::Broadcast);
        assert!((257 * MIB..258 * MIB).contains(&broadcast), "{broadcast}");
    }

    #[test]
    fn gathered_ops_count_send_and_receive() {
        let plan = plan(vec![BenchOp::Allgather], 64 << 20);
        let need = Footprint {
            plan: &plan,
            ranks: 4,
            direct: true,
            engine: None,
        }
        .need_per_rank()
        .unwrap();
        // A 16 MiB block sent, 64 MiB received, 64 MiB of scratch.
        assert!((144 * MIB..145 * MIB).contains(&need), "{need}");
    }

    #[test]
    fn sizes_past_64_bits_are_none() {
        let huge = Plan {
            sizes: vec![usize::MAX],
            ..plan(BenchOp::ALL.to_vec(), 8)
        };
        let footprint = Footprint {
            plan: &huge,
            ranks: 2,
            direct: true,
            engine: None,
        };
        assert_eq!(footprint.need_per_rank(), None);
        let many = Plan {
            iters: usize::MAX,
            ..plan(vec![BenchOp::Allreduce], 8)
        };
        assert_eq!(
            Footprint {
                plan: &many,
                ..footprint
            }
            .need_per_rank(),
            None
        );
    }

    proptest! {
        /// More bytes never need less memory, and the count never panics.
        #[test]
        fn the_need_grows_with_the_size(max in 8usize..1 << 40, ranks in 1usize..9, op_i in 0usize..6, grouped: bool, direct: bool) {
            let options = engine(grouped);
            let footprint = |max| {
                let plan = plan(vec![BenchOp::ALL[op_i]], max);
                Footprint { plan: &plan, ranks, direct, engine: (!direct).then_some(&options) }.need_per_rank()
            };
            let (small, large) = (footprint(max), footprint(max.saturating_mul(2)));
            prop_assert!(small.is_some());
            prop_assert!(large >= small);
            if direct || BenchOp::ALL[op_i] != BenchOp::Sendrecv {
                // The largest size is at least max / 2: one buffer of it.
                prop_assert!(small.unwrap_or(0) >= u64::try_from(max / 2).unwrap_or(0));
            }
        }
    }
}
