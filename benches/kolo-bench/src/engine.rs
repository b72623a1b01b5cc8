//! Engine mode: the sweep through the whole kolo engine (negotiation,
//! response cache, fusion, background thread), K tensors per step.
//!
//! Each step submits every tensor asynchronously, then waits for all of
//! them; the reported time is per step. The barrier before the timed steps
//! and the exchange of timings go through the engine too, so engine mode needs
//! nothing but a [`Kolo`] and works on any backend the facade can start.

use crate::cli::Args;
use crate::engine_case::{skip_reason, EngineCase, Submission};
use crate::error::BenchError;
use crate::op::BenchOp;
use crate::plan::Plan;
use crate::reference::Spec;
use crate::report::Reporter;
use crate::row::{Row, RunInfo};
use crate::stats::{summarize, RankReport, RESERVED_TIMES};
use kolo::Kolo;
use kolo_transport::{with_element_type, Element};
use std::time::{Duration, Instant};

/// The engine settings of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOptions {
    /// Tensors per step.
    pub tensors: usize,
    /// How allreduces are submitted.
    pub submission: Submission,
    /// `KOLO_*` from the environment, overridden by the flags.
    pub config: kolo::Config,
}

impl EngineOptions {
    /// The options `args` ask for: the environment's config with
    /// `--fusion-threshold` and `--cycle-time` applied.
    pub fn from_args(args: &Args) -> Result<EngineOptions, BenchError> {
        let mut config =
            kolo::Config::from_env().map_err(|e| BenchError::InvalidArgs(e.to_string()))?;
        if let Some(bytes) = args.fusion_threshold {
            config = config.fusion_threshold(bytes);
        }
        if let Some(ms) = args.cycle_time {
            let cycle = Duration::try_from_secs_f64(ms / 1e3)
                .map_err(|e| BenchError::InvalidArgs(format!("--cycle-time {ms}: {e}")))?;
            config = config.cycle_time(cycle);
        }
        Ok(EngineOptions {
            tensors: args.tensors,
            submission: Submission {
                grouped: args.grouped || args.tensor_group,
                tensor_group: args.tensor_group,
                compression: args.compression,
            },
            config,
        })
    }
}

/// The ops of `ops` the engine has (all but sendrecv); an error naming the
/// op when none is left.
pub fn engine_ops(ops: &[BenchOp]) -> Result<Vec<BenchOp>, BenchError> {
    let kept: Vec<BenchOp> = ops
        .iter()
        .copied()
        .filter(|&op| op != BenchOp::Sendrecv)
        .collect();
    if kept.is_empty() {
        return Err(BenchError::InvalidArgs(
            "--engine: sendrecv has no engine operation (use direct mode)".to_string(),
        ));
    }
    Ok(kept)
}

/// `plan` as engine mode runs it: without sendrecv (noted through
/// `reporter`), with a line saying the engine's settings.
pub fn engine_plan(
    plan: &Plan,
    options: &EngineOptions,
    reporter: &Reporter,
) -> Result<Plan, BenchError> {
    let ops = engine_ops(&plan.ops)?;
    if ops.len() < plan.ops.len() {
        reporter.print("# sendrecv: skipped (the engine has no send/recv)")?;
    }
    let grouped = if options.submission.tensor_group {
        ", one TensorGroup, blocking"
    } else if options.submission.grouped {
        ", one TensorGroup, in a scope"
    } else {
        ", one allreduce_async per tensor, in a scope"
    };
    reporter.print(&format!(
        "# engine: fusion threshold {} B, cycle time {:.3} ms{grouped}",
        options.config.fusion_threshold,
        options.config.cycle_time.as_secs_f64() * 1e3
    ))?;
    Ok(Plan {
        ops,
        baseline: false,
        ..plan.clone()
    })
}

/// Whether engine mode has a size to measure on `ranks` ranks with
/// `options.tensors` tensors per step: an error saying why every size is
/// skipped, rather than empty tables and success.
pub fn measurable(plan: &Plan, options: &EngineOptions, ranks: usize) -> Result<(), BenchError> {
    let mut last_reason = None;
    for op in engine_ops(&plan.ops)? {
        for layout in plan.layouts(op, ranks) {
            let spec = Spec {
                op,
                dtype: plan.dtype,
                redop: plan.redop,
                layout,
                ranks,
            };
            match skip_reason(&spec, options.tensors) {
                None => return Ok(()),
                Some(reason) => last_reason = Some(format!("{op} {reason}")),
            }
        }
    }
    Err(BenchError::InvalidArgs(format!(
        "--tensors {}: no size of the sweep can be measured on {ranks} ranks; the largest: {}",
        options.tensors,
        last_reason.unwrap_or_default()
    )))
}

/// Runs the sweep on `ranks` thread ranks, each with its own engine.
pub fn run_threads(
    ranks: usize,
    plan: &Plan,
    options: &EngineOptions,
    info: &RunInfo,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    let plan = engine_plan(plan, options, reporter)?;
    let outcomes = kolo::threads::run(ranks, options.config.clone(), |kolo| {
        Ok(run_rank(kolo, &plan, options, info, reporter))
    })
    .map_err(|e| BenchError::Launch {
        backend: "threads (engine)",
        message: e.to_string(),
    })?;
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(rank_rows) => rows.extend(rank_rows),
            Err(e) => errors.push(e),
        }
    }
    // A rank's own failure shuts the others down: report the cause, not
    // its echoes.
    match errors.iter().position(|e| !is_echo(e)) {
        Some(cause) => Err(errors.swap_remove(cause)),
        None => errors.into_iter().next().map_or(Ok(rows), Err),
    }
}

/// One rank's whole engine sweep of `plan` (an [`engine_plan`]) on `kolo`,
/// whatever backend runs it; the rows on rank 0.
pub fn run_rank(
    kolo: &Kolo,
    plan: &Plan,
    options: &EngineOptions,
    info: &RunInfo,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    with_element_type!(plan.dtype, T => sweep::<T>(kolo, plan, options, info, reporter))
}

fn is_echo(error: &BenchError) -> bool {
    matches!(
        error,
        BenchError::Engine {
            source: kolo::Error::ShutDown { .. } | kolo::Error::RankFailed { .. },
            ..
        }
    )
}

/// One rank's whole sweep; rows on rank 0.
fn sweep<T: Element>(
    kolo: &Kolo,
    plan: &Plan,
    options: &EngineOptions,
    info: &RunInfo,
    reporter: &Reporter,
) -> Result<Vec<Row>, BenchError> {
    let (rank, ranks) = (kolo.rank(), kolo.size());
    let mut rows = Vec::new();
    for &op in &plan.ops {
        if rank == 0 {
            reporter.begin_op(op, info, ranks)?;
        }
        let layouts = plan.layouts(op, ranks);
        for (index, &layout) in layouts.iter().enumerate() {
            let spec = Spec {
                op,
                dtype: plan.dtype,
                redop: plan.redop,
                layout,
                ranks,
            };
            // Every rank skips the same sizes: too small for K tensors.
            let made = EngineCase::<T>::new(spec, rank, options.tensors, options.submission);
            let Some(case) = made? else {
                if rank == 0 {
                    if let Some(reason) = skip_reason(&spec, options.tensors) {
                        reporter.print(&format!("#   {reason}"))?;
                    }
                }
                continue;
            };
            if rank == 0 {
                reporter.progress(op, layout.bytes, index, layouts.len());
            }
            let (report, counters) = measure(kolo, case, &spec, plan)?;
            if let Some(row) = gather_row(kolo, info, &spec, &report)? {
                reporter.row(&row)?;
                reporter.print(&counters.line(plan.iters))?;
                rows.push(row);
            }
        }
        reporter.clear_progress();
    }
    Ok(rows)
}

/// What this rank's engine did during the timed steps ([`kolo::Stats`]
/// after minus before).
struct Counters {
    operations: u64,
    tensors: u64,
    gathered_cycles: u64,
    cache_hits: u64,
}

impl Counters {
    fn between(before: &kolo::Stats, after: &kolo::Stats) -> Counters {
        Counters {
            operations: after.operations - before.operations,
            tensors: after.tensors - before.tensors,
            gathered_cycles: after.gathered_cycles - before.gathered_cycles,
            cache_hits: after.cache_hits - before.cache_hits,
        }
    }

    /// A comment line under the row: per timed step, the operations the
    /// tensors became and how they were negotiated (a warm cache gathers
    /// no request list).
    fn line(&self, steps: usize) -> String {
        let per = |n: u64| n as f64 / steps.max(1) as f64;
        format!(
            "#   per step (rank 0): {:.2} data-plane operations carrying {:.1} tensors; \
             {:.2} cycles gathered request lists to rank 0; {:.1} cache hits",
            per(self.operations),
            per(self.tensors),
            per(self.gathered_cycles),
            per(self.cache_hits),
        )
    }
}

/// `warmup + iters` steps back to back, with an engine barrier between the
/// warm-up and the timed ones; the timed ones recorded (and the engine's
/// counters over them), the last one checked when asked.
fn measure<T: Element>(
    kolo: &Kolo,
    mut case: EngineCase<T>,
    spec: &Spec,
    plan: &Plan,
) -> Result<(RankReport, Counters), BenchError> {
    let failed = |source| BenchError::Engine {
        op: spec.op.name(),
        bytes: spec.layout.bytes,
        rank: kolo.rank(),
        source,
    };
    // `Args::plan` bounds warmup + iters.
    let total = plan.warmup.saturating_add(plan.iters);
    let mut times_us = Vec::with_capacity(plan.iters.min(RESERVED_TIMES));
    let mut before = kolo.stats();
    for iteration in 0..total {
        case.prepare(iteration + 1 == total);
        if iteration == plan.warmup {
            kolo.barrier().map_err(failed)?;
            before = kolo.stats();
        }
        let start = Instant::now();
        case.step(kolo).map_err(failed)?;
        let elapsed = start.elapsed().as_secs_f64() * 1e6;
        case.finish();
        if iteration >= plan.warmup {
            times_us.push(elapsed);
        }
    }
    let counters = Counters::between(&before, &kolo.stats());
    let wrong = plan.check.then(|| case.wrong());
    Ok((RankReport { times_us, wrong }, counters))
}

/// Every rank's report, through an engine allgather; rank 0 returns the row.
fn gather_row(
    kolo: &Kolo,
    info: &RunInfo,
    spec: &Spec,
    report: &RankReport,
) -> Result<Option<Row>, BenchError> {
    let (rank, ranks) = (kolo.rank(), kolo.size());
    let bytes = report.encode();
    let all = kolo
        .allgather("kolo-bench/report", &bytes[..])
        .map_err(|source| BenchError::Engine {
            op: "report allgather",
            bytes: bytes.len(),
            rank,
            source,
        })?;
    if rank != 0 {
        return Ok(None);
    }
    // Every rank timed the same number of steps: equal-length reports.
    if all.len() != ranks * bytes.len() {
        return Err(BenchError::MalformedReport {
            rank,
            reason: format!(
                "{} bytes gathered from {ranks} ranks of {} bytes each",
                all.len(),
                bytes.len()
            ),
        });
    }
    let reports = all
        .chunks(bytes.len().max(1))
        .enumerate()
        .map(|(r, chunk)| RankReport::decode(chunk, r))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Row::new(info, spec, summarize(&reports)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sendrecv_is_dropped_or_refused() {
        assert_eq!(
            engine_ops(&BenchOp::ALL).unwrap(),
            BenchOp::ALL[..5].to_vec()
        );
        let err = engine_ops(&[BenchOp::Sendrecv]).unwrap_err().to_string();
        assert!(err.contains("sendrecv"), "{err}");
    }
}
