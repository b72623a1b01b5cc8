//! Direct mode: the sweep run on a backend's collectives, one call per
//! iteration, timed on every rank and summarized on rank 0; with a
//! [`Baseline`], every allreduce iteration also runs the plain library
//! call on buffers filled the same way, in the same loop.

use crate::baseline::{Baseline, NoBaseline};
use crate::case::Case;
use crate::error::BenchError;
use crate::launcher::RankJob;
use crate::op::BenchOp;
use crate::plan::Plan;
use crate::reference::Spec;
use crate::report::Reporter;
use crate::row::{Mode, Row, RunInfo};
use crate::stats::{summarize, RankReport, RESERVED_TIMES};
use kolo_transport::{
    with_element_type, Backend, Element, Result as TransportResult, TransportError,
};
use std::time::Instant;

/// The [`RankJob`] of direct mode. Rank 0 returns every row (and prints
/// them through the reporter as they complete); other ranks return none.
#[derive(Debug)]
pub struct DirectJob<'a, X: Baseline = NoBaseline> {
    pub plan: &'a Plan,
    pub info: RunInfo,
    pub reporter: &'a Reporter,
    /// Also times this plain allreduce after the backend's, for every
    /// allreduce size (its rows are [`Mode::Baseline`], printed as their
    /// own table after the op's).
    pub baseline: Option<&'a X>,
}

impl<'a> DirectJob<'a, NoBaseline> {
    /// A direct job without a baseline.
    pub fn new(plan: &'a Plan, info: RunInfo, reporter: &'a Reporter) -> Self {
        DirectJob {
            plan,
            info,
            reporter,
            baseline: None,
        }
    }
}

impl<X: Baseline> RankJob for DirectJob<'_, X> {
    type Output = Vec<Row>;

    fn run<B: Backend>(&self, comm: &mut B) -> Result<Vec<Row>, BenchError> {
        with_element_type!(self.plan.dtype, T => self.run_typed::<B, T>(comm))
    }
}

impl<X: Baseline> DirectJob<'_, X> {
    fn run_typed<B: Backend, T: Element>(&self, comm: &mut B) -> Result<Vec<Row>, BenchError> {
        let (rank, ranks) = (comm.rank(), comm.size());
        let baseline_info = RunInfo {
            mode: Mode::Baseline,
            ..self.info.clone()
        };
        let mut rows = Vec::new();
        for &op in &self.plan.ops {
            if rank == 0 {
                self.reporter.begin_op(op, &self.info, ranks)?;
            }
            let baseline = self.baseline.filter(|_| op == BenchOp::Allreduce);
            let mut baseline_rows = Vec::new();
            let layouts = self.plan.layouts(op, ranks);
            for (index, &layout) in layouts.iter().enumerate() {
                if rank == 0 {
                    self.reporter
                        .progress(op, layout.bytes, index, layouts.len());
                }
                let spec = Spec {
                    op,
                    dtype: self.plan.dtype,
                    redop: self.plan.redop,
                    layout,
                    ranks,
                };
                let (report, baseline_report) = match baseline {
                    None => (measure::<B, T>(comm, spec, self.plan)?, None),
                    Some(baseline) => {
                        let (kolo, plain) =
                            measure_with_baseline::<B, T, X>(comm, spec, self.plan, baseline)?;
                        (kolo, Some(plain))
                    }
                };
                if let Some(row) = gather_row(comm, &self.info, &spec, &report)? {
                    self.reporter.row(&row)?;
                    rows.push(row);
                }
                if let Some(report) = baseline_report {
                    baseline_rows.extend(gather_row(comm, &baseline_info, &spec, &report)?);
                }
            }
            self.reporter.clear_progress();
            if !baseline_rows.is_empty() {
                self.reporter.begin_op(op, &baseline_info, ranks)?;
                for row in &baseline_rows {
                    self.reporter.row(row)?;
                }
                rows.append(&mut baseline_rows);
            }
        }
        Ok(rows)
    }
}

/// Runs `warmup + iters` iterations of `spec` on this rank back to back,
/// with a barrier between the warm-up and the timed ones (not before each:
/// a barrier's own exit skew would be timed as the slowest rank's wait);
/// checks the last one when asked.
fn measure<B: Backend, T: Element>(
    comm: &mut B,
    spec: Spec,
    plan: &Plan,
) -> Result<RankReport, BenchError> {
    let rank = comm.rank();
    let mut case = Case::<T>::new(spec, rank)?;
    let mut times_us = Vec::with_capacity(plan.iters.min(RESERVED_TIMES));
    // `Args::plan` bounds warmup + iters.
    let total = plan.warmup.saturating_add(plan.iters);
    for iteration in 0..total {
        case.prepare(iteration + 1 == total);
        if iteration == plan.warmup {
            comm.barrier().map_err(failed(&spec, rank))?;
        }
        let elapsed = timed(|| case.execute(comm)).map_err(failed(&spec, rank))?;
        if iteration >= plan.warmup {
            times_us.push(elapsed);
        }
    }
    let wrong = plan.check.then(|| case.wrong());
    Ok(RankReport { times_us, wrong })
}

/// [`measure`] with the baseline's allreduce timed in the same loop, on
/// buffers filled the same way: every iteration runs both, alternating
/// which goes first, so that a machine whose load changes during the run
/// slows both alike. Returns the (backend, baseline) reports.
fn measure_with_baseline<B: Backend, T: Element, X: Baseline>(
    comm: &mut B,
    spec: Spec,
    plan: &Plan,
    baseline: &X,
) -> Result<(RankReport, RankReport), BenchError> {
    let rank = comm.rank();
    let mut kolo = Case::<T>::new(spec, rank)?;
    let mut plain = Case::<T>::new(spec, rank)?;
    let mut kolo_us = Vec::with_capacity(plan.iters.min(RESERVED_TIMES));
    let mut plain_us = Vec::with_capacity(plan.iters.min(RESERVED_TIMES));
    // `Args::plan` bounds warmup + iters.
    let total = plan.warmup.saturating_add(plan.iters);
    for iteration in 0..total {
        let last = iteration + 1 == total;
        kolo.prepare(last);
        plain.prepare(last);
        if iteration == plan.warmup {
            comm.barrier().map_err(failed(&spec, rank))?;
        }
        let mut run_plain = || timed(|| baseline.allreduce(plain.recv_mut(), spec.redop));
        let (k, p) = if iteration % 2 == 0 {
            let k = timed(|| kolo.execute(comm));
            (k, run_plain())
        } else {
            let p = run_plain();
            (timed(|| kolo.execute(comm)), p)
        };
        let k = k.map_err(failed(&spec, rank))?;
        let p = p.map_err(failed(&spec, rank))?;
        if iteration >= plan.warmup {
            kolo_us.push(k);
            plain_us.push(p);
        }
    }
    let report = |case: &Case<T>, times_us| RankReport {
        times_us,
        wrong: plan.check.then(|| case.wrong()),
    };
    Ok((report(&kolo, kolo_us), report(&plain, plain_us)))
}

/// The time `run` takes, in µs, if it succeeds.
fn timed(run: impl FnOnce() -> TransportResult<()>) -> TransportResult<f64> {
    let start = Instant::now();
    run()?;
    Ok(start.elapsed().as_secs_f64() * 1e6)
}

/// The error of `spec`'s collective failing on `rank`.
fn failed(spec: &Spec, rank: usize) -> impl Fn(TransportError) -> BenchError {
    let (op, bytes) = (spec.op.name(), spec.layout.bytes);
    move |source| BenchError::Collective {
        op,
        bytes,
        rank,
        source,
    }
}

/// Sends this rank's report to rank 0, which returns the row.
fn gather_row<B: Backend>(
    comm: &mut B,
    info: &RunInfo,
    spec: &Spec,
    report: &RankReport,
) -> Result<Option<Row>, BenchError> {
    let rank = comm.rank();
    let gathered = comm
        .gather_bytes(&report.encode(), 0)
        .map_err(|source| BenchError::Gather { rank, source })?;
    let Some(messages) = gathered else {
        return Ok(None);
    };
    let reports = messages
        .iter()
        .enumerate()
        .map(|(r, bytes)| RankReport::decode(bytes, r))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Row::new(info, spec, summarize(&reports)?)))
}
