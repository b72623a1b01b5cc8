//! The command line, and its translation into a [`Plan`].

use crate::error::BenchError;
use crate::launcher::BackendKind;
use crate::op::BenchOp;
use crate::plan::Plan;
use crate::size::{parse_size, sweep};
use clap::Parser;
use kolo_protocol::{DataType, ReduceOp};
use std::path::PathBuf;

/// nccl-tests-style benchmark of kolo's collectives: one table row per size
/// with the median time, algorithm and bus bandwidth, and the number of
/// wrong result elements.
#[derive(Clone, Debug, Parser)]
#[command(name = "kolo-bench", version)]
pub struct Args {
    /// The backend that runs the ranks. `mpi` runs one rank per process:
    /// `mpirun -np 4 kolo-bench --backend mpi ...` (built with
    /// `--features mpi`).
    #[arg(long, value_enum, default_value_t = BackendKind::Threads)]
    pub backend: BackendKind,
    /// Number of ranks (threads backend; under MPI, `mpirun -np` decides).
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// The collective(s) to measure, comma-separated, or `all`.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "allreduce")]
    pub op: Vec<OpArg>,
    /// Element type: u8, i8, u16, i16, i32, i64, f16, bf16, f32, f64, bool.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: DataType,
    /// Reduction of allreduce and reducescatter: sum, average (avg), min,
    /// max, product (prod).
    #[arg(long, default_value = "sum", value_parser = parse_redop)]
    pub redop: ReduceOp,
    /// Smallest size in bytes (suffixes K, M, G: 8, 64K, 16M, 1G).
    #[arg(long, default_value = "8", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size in bytes (suffixes K, M, G).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiplier from one size to the next.
    #[arg(long, default_value_t = 2)]
    pub factor: usize,
    /// Timed iterations per size (the time is their median).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed iterations before them.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Check the last iteration's result against the reference (default).
    #[arg(long, overrides_with = "no_check")]
    pub check: bool,
    /// Skip the check (#wrong shows N/A).
    #[arg(long, overrides_with = "check")]
    pub no_check: bool,
    /// Also write the rows as a JSON array to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Measure the full kolo engine (negotiation, fusion, background thread)
    /// instead of the backend's collectives.
    #[arg(long)]
    pub engine: bool,
    /// Engine mode: tensors submitted per step, each size/K bytes.
    #[arg(long, default_value_t = 1, requires = "engine")]
    pub tensors: usize,
    /// Engine mode: submit the allreduce tensors as one group, a
    /// `kolo::TensorGroup` made before the timing, submitted in a scope
    /// step after step (without it: one `allreduce_async` per tensor in a
    /// scope).
    #[arg(long, requires = "engine")]
    pub grouped: bool,
    /// Engine mode: submit the group with the blocking
    /// `Kolo::allreduce_group` instead (the caller's wait runs the step).
    /// Implies `--grouped`.
    #[arg(long, requires = "engine")]
    pub tensor_group: bool,
    /// Engine mode: how allreduce data travels: none, fp16 or bf16 (f32 and
    /// f64 data cast to 16 bits for the collective; results rounded).
    #[arg(long, default_value = "none", value_parser = parse_compression, requires = "engine")]
    pub compression: kolo::Compression,
    /// Engine mode: the fusion threshold in bytes (default: KOLO_* env, then
    /// kolo's default).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, requires = "engine")]
    pub fusion_threshold: Option<usize>,
    /// Engine mode: the cycle time in milliseconds (default: KOLO_* env,
    /// then kolo's default).
    #[arg(
        long,
        value_name = "MS",
        requires = "engine",
        allow_negative_numbers = true
    )]
    pub cycle_time: Option<f64>,
    /// mpi backend, direct mode: in every allreduce iteration also time a
    /// plain `MPI_Allreduce` (in place, through rsmpi's ffi) on an identical
    /// buffer, alternating which goes first; print its table and the
    /// comparison.
    #[arg(long, conflicts_with = "engine")]
    pub baseline: bool,
    /// Measure direct mode, then engine mode (one tensor per step), in this
    /// one run — plus the plain `MPI_Allreduce` baseline on the mpi backend
    /// — and print per op and size: direct vs MPI, engine minus direct.
    #[arg(long, conflicts_with = "engine")]
    pub compare: bool,
    /// No progress line on stderr (it is shown only on a terminal anyway).
    #[arg(long)]
    pub quiet: bool,
}

/// A `--compression` value.
fn parse_compression(name: &str) -> Result<kolo::Compression, String> {
    kolo::Compression::from_name(name)
        .ok_or_else(|| format!("unknown compression {name:?}: none, fp16 or bf16"))
}

/// `--op` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OpArg {
    Allreduce,
    Allgather,
    Broadcast,
    Reducescatter,
    Alltoall,
    Sendrecv,
    /// Every op, in the order above.
    All,
}

impl OpArg {
    fn ops(self) -> Vec<BenchOp> {
        match self {
            OpArg::Allreduce => vec![BenchOp::Allreduce],
            OpArg::Allgather => vec![BenchOp::Allgather],
            OpArg::Broadcast => vec![BenchOp::Broadcast],
            OpArg::Reducescatter => vec![BenchOp::Reducescatter],
            OpArg::Alltoall => vec![BenchOp::Alltoall],
            OpArg::Sendrecv => vec![BenchOp::Sendrecv],
            OpArg::All => BenchOp::ALL.to_vec(),
        }
    }
}

fn parse_dtype(text: &str) -> Result<DataType, String> {
    DataType::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
        format!("unknown dtype {text:?} (one of {})", names.join(", "))
    })
}

fn parse_redop(text: &str) -> Result<ReduceOp, String> {
    ReduceOp::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = ReduceOp::ALL.iter().map(|o| o.name()).collect();
        format!("unknown redop {text:?} (one of {})", names.join(", "))
    })
}

impl Args {
    /// Whether results are checked (`--no-check` unless a later `--check`).
    pub fn checking(&self) -> bool {
        !self.no_check
    }

    /// The sweep the flags describe; flag values that cannot run are an
    /// error naming them.
    pub fn plan(&self) -> Result<Plan, BenchError> {
        if self.ranks == 0 {
            return Err(BenchError::InvalidArgs("--ranks must be at least 1".into()));
        }
        if self.iters == 0 {
            return Err(BenchError::InvalidArgs("--iters must be at least 1".into()));
        }
        if self.warmup.checked_add(self.iters).is_none() {
            return Err(BenchError::InvalidArgs(format!(
                "--warmup {} plus --iters {} does not fit in 64 bits",
                self.warmup, self.iters
            )));
        }
        if self.tensors == 0 {
            return Err(BenchError::InvalidArgs(
                "--tensors must be at least 1".into(),
            ));
        }
        if let Some(ms) = self.cycle_time {
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(BenchError::InvalidArgs(format!(
                    "--cycle-time {ms} must be a non-negative number of milliseconds"
                )));
            }
        }
        let mut ops: Vec<BenchOp> = Vec::new();
        for op in self.op.iter().flat_map(|o| o.ops()) {
            if !ops.contains(&op) {
                ops.push(op);
            }
        }
        let baseline = self.baseline_wanted(&ops)?;
        Ok(Plan {
            ops,
            dtype: self.dtype,
            redop: self.redop,
            sizes: sweep(self.min_bytes, self.max_bytes, self.factor)?,
            iters: self.iters,
            warmup: self.warmup,
            check: self.checking(),
            baseline,
        })
    }

    /// Whether the plain-MPI baseline runs: asked for with `--baseline`
    /// (an error when it cannot run), or implied by `--compare` on the mpi
    /// backend when it can.
    fn baseline_wanted(&self, ops: &[BenchOp]) -> Result<bool, BenchError> {
        let mpi = self.backend == BackendKind::Mpi;
        let possible = if !mpi {
            Err("it needs --backend mpi".to_string())
        } else if !ops.contains(&BenchOp::Allreduce) {
            Err("it times MPI_Allreduce: include allreduce in --op".to_string())
        } else {
            crate::baseline::supports(self.dtype, self.redop)
        };
        match possible {
            Ok(()) => Ok(self.baseline || self.compare),
            Err(why) if self.baseline => Err(BenchError::InvalidArgs(format!(
                "--baseline (a plain MPI_Allreduce): {why}"
            ))),
            Err(_) => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("kolo-bench").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let args = parse(&[]).unwrap();
        let plan = args.plan().unwrap();
        assert_eq!(args.backend, BackendKind::Threads);
        assert_eq!(args.ranks, 2);
        assert_eq!(plan.ops, vec![BenchOp::Allreduce]);
        assert_eq!((plan.dtype, plan.redop), (DataType::F32, ReduceOp::Sum));
        assert_eq!((plan.sizes[0], *plan.sizes.last().unwrap()), (8, 64 << 20));
        assert_eq!((plan.iters, plan.warmup, plan.check), (20, 5, true));
        assert!(!args.engine && args.json.is_none());
        assert!(!args.baseline && !args.compare && !plan.baseline);
    }

    #[test]
    fn baseline_and_compare() {
        let plan = |args: &[&str]| parse(args).unwrap().plan();
        assert!(plan(&["--backend", "mpi", "--baseline"]).unwrap().baseline);
        assert!(plan(&["--backend", "mpi", "--compare"]).unwrap().baseline);
        assert!(!plan(&["--compare"]).unwrap().baseline, "threads: no MPI");
        for (args, named) in [
            (&["--baseline"][..], "--backend mpi"),
            (
                &["--backend", "mpi", "--baseline", "--op", "broadcast"],
                "allreduce",
            ),
            (&["--backend", "mpi", "--baseline", "--dtype", "f16"], "f16"),
            (
                &["--backend", "mpi", "--baseline", "--redop", "avg"],
                "average",
            ),
        ] {
            let err = plan(args).unwrap_err().to_string();
            assert!(err.contains(named), "{args:?}: {err}");
        }
        // --compare keeps going without the baseline when it cannot run.
        let p = plan(&["--backend", "mpi", "--compare", "--dtype", "bf16"]).unwrap();
        assert!(!p.baseline);
        assert!(parse(&["--engine", "--compare"]).is_err());
        assert!(parse(&["--engine", "--baseline"]).is_err());
    }

    #[test]
    fn the_smoke_test_command_line() {
        let args = parse(&[
            "--backend",
            "threads",
            "--ranks",
            "2",
            "--op",
            "all",
            "--min-bytes",
            "8",
            "--max-bytes",
            "64K",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--json",
            "/tmp/x.json",
        ])
        .unwrap();
        let plan = args.plan().unwrap();
        assert_eq!(plan.ops, BenchOp::ALL.to_vec());
        assert_eq!(plan.sizes.len(), 14);
        assert_eq!(
            args.json.as_deref(),
            Some(std::path::Path::new("/tmp/x.json"))
        );
    }

    #[test]
    fn ops_dtypes_redops_and_check_flags() {
        let args = parse(&[
            "--op",
            "sendrecv,allgather,sendrecv",
            "--dtype",
            "BF16",
            "--redop",
            "avg",
            "--no-check",
        ])
        .unwrap();
        let plan = args.plan().unwrap();
        assert_eq!(plan.ops, vec![BenchOp::Sendrecv, BenchOp::Allgather]);
        assert_eq!(
            (plan.dtype, plan.redop, plan.check),
            (DataType::BF16, ReduceOp::Average, false)
        );
        assert!(parse(&["--no-check", "--check"]).unwrap().checking());
        for dtype in DataType::ALL {
            assert_eq!(parse(&["--dtype", dtype.name()]).unwrap().dtype, dtype);
        }
    }

    #[test]
    fn bad_values_are_errors_naming_them() {
        let err = parse(&["--max-bytes", "12Q"]).unwrap_err().to_string();
        assert!(err.contains("12Q"), "{err}");
        let err = parse(&["--dtype", "f8"]).unwrap_err().to_string();
        assert!(err.contains("f8") && err.contains("bf16"), "{err}");
        let err = parse(&["--redop", "xor"]).unwrap_err().to_string();
        assert!(err.contains("xor"), "{err}");
        assert!(parse(&["--op", "gossip"]).is_err());
        assert!(
            parse(&["--tensors", "4"]).is_err(),
            "--tensors needs --engine"
        );
        let err = parse(&["--iters", "0"])
            .unwrap()
            .plan()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--iters"), "{err}");
        let huge = usize::MAX.to_string();
        let err = parse(&["--iters", &huge, "--warmup", "1"])
            .unwrap()
            .plan()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--warmup 1 plus --iters"), "{err}");
        let err = parse(&["--min-bytes", "1M", "--max-bytes", "1K"])
            .unwrap()
            .plan()
            .unwrap_err()
            .to_string();
        assert!(err.contains("1048576") && err.contains("1024"), "{err}");
        let err = parse(&["--engine", "--cycle-time", "-1"])
            .unwrap()
            .plan()
            .unwrap_err()
            .to_string();
        assert!(err.contains("-1"), "{err}");
    }

    #[test]
    fn engine_flags() {
        let args = parse(&[
            "--engine",
            "--tensors",
            "8",
            "--fusion-threshold",
            "64M",
            "--cycle-time",
            "0.5",
        ])
        .unwrap();
        assert!(args.engine);
        assert_eq!(
            (args.tensors, args.fusion_threshold, args.cycle_time),
            (8, Some(64 << 20), Some(0.5))
        );
    }
}
