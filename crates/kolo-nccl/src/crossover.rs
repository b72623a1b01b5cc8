//! Which allreduce serves a request: kolo-nccl's peer kernels (one-shot or
//! two-shot, see the `kernels::allreduce_ptx` module) or NCCL. A pure
//! function of the request and a table of thresholds, tested without a
//! GPU; every rank computes the same answer from the same inputs, which
//! the peer kernels need (a rank that took NCCL while its peers spun on
//! flags would stall them).
//!
//! NCCL's ring is latency-bound up to a few MiB (on 2 x H200 it reaches
//! 71 GB/s bus bandwidth at 2 MiB against about 330 at 1 GiB); reading the
//! peers' buffers directly is faster there: one-shot (every rank reads
//! every buffer, one synchronisation) for the smallest tensors, two-shot
//! (reduce-scatter and all-gather through the peers' buffers, two
//! synchronisations, `2 (n - 1) / n` of the data moved) up to a few MiB,
//! NCCL above. [`Thresholds::DEFAULT`] holds the crossovers the
//! literature reports for NVLink machines (vLLM, TensorRT-LLM); they are
//! to be replaced by measured ones.
//!
//! ```
//! use kolo_nccl::crossover::{choose, PeerAllreduce, Request, Thresholds};
//! use kolo_protocol::{DataType, ReduceOp};
//! use kolo_transport::Scale;
//!
//! let req = Request {
//!     bytes: 64 << 10,
//!     world: 2,
//!     dtype: DataType::BF16,
//!     op: ReduceOp::Sum,
//!     scale: Scale::NONE,
//!     capacity: 8 << 20,
//!     peers_reachable: true,
//! };
//! assert_eq!(choose(&req, &Thresholds::DEFAULT), PeerAllreduce::OneShot);
//! let big = Request { bytes: 64 << 20, ..req };
//! assert_eq!(choose(&big, &Thresholds::DEFAULT), PeerAllreduce::Nccl);
//! let alone = Request { world: 1, ..req };
//! assert_eq!(choose(&alone, &Thresholds::DEFAULT), PeerAllreduce::Nccl);
//! ```

use crate::error::NcclError;
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::Scale;

/// The environment variable that turns the peer kernels off (`0`).
pub const ENV: &str = "KOLO_NVLINK_ALLREDUCE";

/// The most ranks the peer kernels serve.
pub const MAX_WORLD: usize = 8;

/// What serves an allreduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerAllreduce {
    /// The one-shot peer kernel.
    OneShot,
    /// The two-shot peer kernel.
    TwoShot,
    /// NCCL (or whatever the backend does otherwise).
    Nccl,
}

/// The crossovers for one range of world sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The largest world size of the row (rows are in increasing order).
    pub max_world: usize,
    /// One-shot up to this many bytes (inclusive).
    pub one_shot_max: usize,
    /// Two-shot above that, up to this many bytes (inclusive); NCCL above.
    pub two_shot_max: usize,
}

/// The crossover table: rows by increasing world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// The rows; a world larger than the last row's is NCCL's.
    pub rows: [Row; 3],
}

impl Thresholds {
    /// One-shot below a few hundred KiB, two-shot up to a few MiB, fewer
    /// bytes for more ranks (one-shot reads `world - 1` buffers).
    pub const DEFAULT: Thresholds = Thresholds {
        rows: [
            Row {
                max_world: 2,
                one_shot_max: 512 << 10,
                two_shot_max: 8 << 20,
            },
            Row {
                max_world: 4,
                one_shot_max: 256 << 10,
                two_shot_max: 4 << 20,
            },
            Row {
                max_world: MAX_WORLD,
                one_shot_max: 128 << 10,
                two_shot_max: 2 << 20,
            },
        ],
    };

    /// The largest tensor any row sends to a peer kernel: what a
    /// registered buffer must hold.
    pub fn max_bytes(&self) -> usize {
        self.rows.iter().map(|r| r.two_shot_max).max().unwrap_or(0)
    }

    fn row(&self, world: usize) -> Option<&Row> {
        self.rows.iter().find(|r| world <= r.max_world)
    }
}

/// One allreduce, as every rank sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    /// The tensor's bytes.
    pub bytes: usize,
    /// The number of ranks.
    pub world: usize,
    /// The element type.
    pub dtype: DataType,
    /// The reduction.
    pub op: ReduceOp,
    /// Pre- and post-scale factors.
    pub scale: Scale,
    /// The registered buffers' capacity in bytes (0: none registered).
    pub capacity: usize,
    /// Whether every rank reaches every other rank's registered buffer (as
    /// agreed by all ranks when they registered; false when
    /// [`ENV`] turned the kernels off on any rank).
    pub peers_reachable: bool,
}

/// The path for `req`: a peer kernel when the ranks reach each other's
/// buffers, there are 2 to [`MAX_WORLD`] of them, the dtype is f32, f16 or
/// bf16, the op a sum or an average without a prescale, and the tensor is
/// non-empty, fits the registered buffer and lies below the table's NCCL
/// crossover for this world size; NCCL otherwise.
pub fn choose(req: &Request, table: &Thresholds) -> PeerAllreduce {
    let kernel_dtype = matches!(req.dtype, DataType::F32 | DataType::F16 | DataType::BF16);
    let kernel_op = matches!(req.op, ReduceOp::Sum | ReduceOp::Average);
    let eligible = req.peers_reachable
        && (2..=MAX_WORLD).contains(&req.world)
        && kernel_dtype
        && kernel_op
        && req.scale.prescale == 1.0
        && req.scale.postscale.is_finite()
        && req.bytes > 0
        && req.bytes <= req.capacity;
    let Some(row) = table.row(req.world).filter(|_| eligible) else {
        return PeerAllreduce::Nccl;
    };
    if req.bytes <= row.one_shot_max {
        PeerAllreduce::OneShot
    } else if req.bytes <= row.two_shot_max {
        PeerAllreduce::TwoShot
    } else {
        PeerAllreduce::Nccl
    }
}

/// Whether [`ENV`]'s value (`None`: unset) leaves the peer kernels on:
/// unset, empty, `1`, `true`, `yes`, `on` are on; `0`, `false`, `no`,
/// `off` off (any case, trimmed); anything else is an error naming the
/// variable.
pub fn enabled_by(value: Option<&str>) -> Result<bool, NcclError> {
    let Some(raw) = value else {
        return Ok(true);
    };
    match raw.trim().to_ascii_lowercase().as_str() {
        "" | "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(NcclError::InvalidArgument(format!(
            "invalid value {raw:?} for {ENV}: expected 1/0, true/false, yes/no or on/off"
        ))),
    }
}

/// [`enabled_by`] of this process's environment (a value that is not
/// UTF-8 is an error).
pub fn enabled_by_env() -> Result<bool, NcclError> {
    match std::env::var(ENV) {
        Ok(v) => enabled_by(Some(&v)),
        Err(std::env::VarError::NotPresent) => enabled_by(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(NcclError::InvalidArgument(format!(
            "{ENV} is not valid UTF-8"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(bytes: usize, world: usize) -> Request {
        Request {
            bytes,
            world,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            scale: Scale::NONE,
            capacity: Thresholds::DEFAULT.max_bytes(),
            peers_reachable: true,
        }
    }

    #[test]
    fn the_defaults_cross_over_at_the_table() {
        let t = Thresholds::DEFAULT;
        assert_eq!(choose(&request(8, 2), &t), PeerAllreduce::OneShot);
        assert_eq!(choose(&request(512 << 10, 2), &t), PeerAllreduce::OneShot);
        assert_eq!(
            choose(&request((512 << 10) + 4, 2), &t),
            PeerAllreduce::TwoShot
        );
        assert_eq!(choose(&request(8 << 20, 2), &t), PeerAllreduce::TwoShot);
        assert_eq!(choose(&request((8 << 20) + 4, 2), &t), PeerAllreduce::Nccl);
        assert_eq!(choose(&request(200 << 10, 8), &t), PeerAllreduce::TwoShot);
        assert_eq!(choose(&request(4 << 20, 8), &t), PeerAllreduce::Nccl);
        assert_eq!(choose(&request(8, 1), &t), PeerAllreduce::Nccl);
        assert_eq!(choose(&request(8, 9), &t), PeerAllreduce::Nccl);
        assert_eq!(choose(&request(0, 2), &t), PeerAllreduce::Nccl);
        assert_eq!(t.max_bytes(), 8 << 20);
    }

    #[test]
    fn the_environment_switch_parses() {
        for on in [
            None,
            Some(""),
            Some("1"),
            Some(" TRUE "),
            Some("yes"),
            Some("on"),
        ] {
            assert!(enabled_by(on).unwrap(), "{on:?}");
        }
        for off in ["0", "false", "No", "off"] {
            assert!(!enabled_by(Some(off)).unwrap(), "{off}");
        }
        let err = enabled_by(Some("2")).unwrap_err().to_string();
        assert!(err.contains(ENV) && err.contains("\"2\""), "{err}");
    }

    fn dtypes() -> impl Strategy<Value = DataType> {
        prop::sample::select(vec![
            DataType::F32,
            DataType::F16,
            DataType::BF16,
            DataType::F64,
            DataType::I32,
            DataType::U8,
            DataType::Bool,
        ])
    }

    fn ops() -> impl Strategy<Value = ReduceOp> {
        prop::sample::select(vec![
            ReduceOp::Sum,
            ReduceOp::Average,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Product,
        ])
    }

    fn requests() -> impl Strategy<Value = Request> {
        (
            0usize..(16 << 20),
            0usize..12,
            dtypes(),
            ops(),
            prop::sample::select(vec![1.0, 0.5, 2.0]),
            prop::sample::select(vec![1.0, 0.25]),
            prop::sample::select(vec![0usize, 1 << 20, 8 << 20]),
            any::<bool>(),
        )
            .prop_map(
                |(bytes, world, dtype, op, prescale, postscale, capacity, peers_reachable)| {
                    Request {
                        bytes,
                        world,
                        dtype,
                        op,
                        scale: Scale {
                            prescale,
                            postscale,
                        },
                        capacity,
                        peers_reachable,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn a_kernel_only_where_it_applies(req in requests()) {
            let path = choose(&req, &Thresholds::DEFAULT);
            if path != PeerAllreduce::Nccl {
                prop_assert!(req.peers_reachable);
                prop_assert!((2..=MAX_WORLD).contains(&req.world));
                prop_assert!(matches!(req.dtype, DataType::F32 | DataType::F16 | DataType::BF16));
                prop_assert!(matches!(req.op, ReduceOp::Sum | ReduceOp::Average));
                prop_assert_eq!(req.scale.prescale, 1.0);
                prop_assert!(req.bytes > 0 && req.bytes <= req.capacity);
                prop_assert!(req.bytes <= Thresholds::DEFAULT.max_bytes());
            }
        }

        #[test]
        fn more_bytes_never_move_back_to_a_smaller_algorithm(req in requests(), extra in 0usize..(4 << 20)) {
            let rank = |p: PeerAllreduce| match p {
                PeerAllreduce::OneShot => 0,
                PeerAllreduce::TwoShot => 1,
                PeerAllreduce::Nccl => 2,
            };
            let bigger = Request { bytes: req.bytes.saturating_add(extra), ..req };
            if req.bytes > 0 {
                prop_assert!(rank(choose(&req, &Thresholds::DEFAULT)) <= rank(choose(&bigger, &Thresholds::DEFAULT)));
            }
        }

        #[test]
        fn more_ranks_never_raise_a_threshold(bytes in 1usize..(16 << 20), world in 2usize..8) {
            let t = Thresholds::DEFAULT;
            let rank = |p: PeerAllreduce| match p {
                PeerAllreduce::OneShot => 0,
                PeerAllreduce::TwoShot => 1,
                PeerAllreduce::Nccl => 2,
            };
            prop_assert!(rank(choose(&request(bytes, world), &t)) <= rank(choose(&request(bytes, world + 1), &t)));
        }

        #[test]
        fn opting_out_or_unreachable_peers_is_always_nccl(req in requests()) {
            let off = Request { peers_reachable: false, ..req };
            prop_assert_eq!(choose(&off, &Thresholds::DEFAULT), PeerAllreduce::Nccl);
        }
    }
}
