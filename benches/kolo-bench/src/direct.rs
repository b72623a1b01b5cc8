//! Direct mode: the sweep run on a backend's collectives, one call per
//! iteration, timed on every rank and summarized on rank 0.

use crate::case::Case;
use crate::error::BenchError;
use crate::launcher::RankJob;
use crate::plan::Plan;
use crate::reference::Spec;
use crate::report::Reporter;
use crate::row::{Row, RunInfo};
use crate::stats::{summarize, RankReport};
use kolo_transport::{with_element_type, Backend, Element};
use std::time::Instant;

/// The [`RankJob`] of direct mode. Rank 0 returns every row (and prints
/// them through the reporter as they complete); other ranks return none.
#[derive(Debug)]
pub struct DirectJob<'a> {
    pub plan: &'a Plan,
    pub info: RunInfo,
    pub reporter: &'a Reporter,
}

impl RankJob for DirectJob<'_> {
    type Output = Vec<Row>;

    fn run<B: Backend>(&self, comm: &mut B) -> Result<Vec<Row>, BenchError> {
        with_element_type!(self.plan.dtype, T => self.run_typed::<B, T>(comm))
    }
}

impl DirectJob<'_> {
    fn run_typed<B: Backend, T: Element>(&self, comm: &mut B) -> Result<Vec<Row>, BenchError> {
        let (rank, ranks) = (comm.rank(), comm.size());
        let mut rows = Vec::new();
        for &op in &self.plan.ops {
            if rank == 0 {
                self.reporter.begin_op(op, &self.info, ranks)?;
            }
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
                let report = measure::<B, T>(comm, spec, self.plan)?;
                if let Some(row) = gather_row(comm, &self.info, &spec, &report)? {
                    self.reporter.row(&row)?;
                    rows.push(row);
                }
            }
            self.reporter.clear_progress();
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
    let failed = |source| BenchError::Collective {
        op: spec.op.name(),
        bytes: spec.layout.bytes,
        rank,
        source,
    };
    let mut case = Case::<T>::new(spec, rank);
    let total = plan.warmup + plan.iters;
    let mut times_us = Vec::with_capacity(plan.iters);
    for iteration in 0..total {
        case.prepare(iteration + 1 == total);
        if iteration == plan.warmup {
            comm.barrier().map_err(failed)?;
        }
        let start = Instant::now();
        case.execute(comm).map_err(failed)?;
        let elapsed = start.elapsed().as_secs_f64() * 1e6;
        if iteration >= plan.warmup {
            times_us.push(elapsed);
        }
    }
    let wrong = plan.check.then(|| case.wrong());
    Ok(RankReport { times_us, wrong })
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
