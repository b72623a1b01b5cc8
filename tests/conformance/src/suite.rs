//! The whole suite: a deterministic sequence of cases, the same on every
//! rank.

use crate::checks::{
    check_allgatherv, check_allreduce, check_allreduce_segments, check_alltoallv, check_barrier,
    check_broadcast, check_controller, check_reduce_scatter, check_send_recv, check_sendrecv,
    check_transaction,
};
use crate::failure::Failure;
use crate::values::{uneven_counts, uneven_segments};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{with_element_type, Collectives, Controller, Element, Scale};
use std::collections::BTreeMap;
use std::fmt;

/// What [`run_suite`] runs.
#[derive(Clone, Debug, PartialEq)]
pub struct SuiteOptions {
    /// Data types of the small-count cases (default: all eleven).
    pub dtypes: Vec<DataType>,
    /// Bytes of data in the large case of each operation; 0 skips the large
    /// cases (default 4 MiB).
    pub large_bytes: usize,
    /// Data types of the large cases (default f32, bf16, i64, u8).
    pub large_dtypes: Vec<DataType>,
    /// Run the control-plane cases (default true).
    pub controller: bool,
    /// Run [`crate::check_send_recv`], which receives messages in another
    /// order than they were sent and so needs sends that complete before
    /// the matching receive is posted (default true).
    pub unordered_p2p: bool,
}

impl Default for SuiteOptions {
    fn default() -> Self {
        SuiteOptions {
            dtypes: DataType::ALL.to_vec(),
            large_bytes: 4 << 20,
            large_dtypes: vec![DataType::F32, DataType::BF16, DataType::I64, DataType::U8],
            controller: true,
            unordered_p2p: true,
        }
    }
}

impl SuiteOptions {
    /// A fast subset: five dtypes (u8, i32, bf16, f32, bool), no large cases.
    pub fn quick() -> Self {
        SuiteOptions {
            dtypes: vec![
                DataType::U8,
                DataType::I32,
                DataType::BF16,
                DataType::F32,
                DataType::Bool,
            ],
            large_bytes: 0,
            ..SuiteOptions::default()
        }
    }
}

/// What a passing run covered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Cases run.
    pub cases: usize,
    /// Cases per operation name.
    pub per_operation: BTreeMap<&'static str, usize>,
}

impl Report {
    /// Counts `cases` more cases of `operation`.
    pub fn add(&mut self, operation: &'static str, cases: usize) {
        self.cases += cases;
        *self.per_operation.entry(operation).or_default() += cases;
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cases", self.cases)?;
        for (i, (operation, cases)) in self.per_operation.iter().enumerate() {
            write!(f, "{} {operation} {cases}", if i == 0 { ":" } else { "," })?;
        }
        Ok(())
    }
}

/// Elements of the mid-sized case: prime, longer than the f16 / bf16
/// kernel blocks.
pub const MEDIUM_COUNT: usize = 1021;

/// The small counts for a communicator of `size` ranks: 0, 1, `size - 1`,
/// `2 size + 1` (not divisible by `size` unless it is 1) and
/// [`MEDIUM_COUNT`], without repeats.
pub fn small_counts(size: usize) -> Vec<usize> {
    let mut counts = vec![0, 1, size.saturating_sub(1), 2 * size + 1, MEDIUM_COUNT];
    counts.sort_unstable();
    counts.dedup();
    counts
}

/// The segment layouts of the small `allreduce_segments` cases for `size`
/// ranks: no segments, one of `2 size + 1`, and every small count (empty
/// ones twice) in one call.
pub fn small_segment_layouts(size: usize) -> Vec<Vec<usize>> {
    let mut mixed = small_counts(size);
    mixed.reverse();
    mixed.push(0);
    vec![vec![], vec![2 * size + 1], mixed]
}

/// Segments of the large `allreduce_segments` case: 1,000 of 1,024
/// elements (a fused response of many small tensors).
pub const MANY_SEGMENTS: [usize; 1000] = [1024; 1000];

/// The scaled variant every reduction is also run with.
pub(crate) const SCALED: Scale = Scale {
    prescale: 0.5,
    postscale: 2.0,
};

/// Runs the whole suite on `comm`. Call it on every rank of the
/// communicator with the same options: the cases come in the same order on
/// every rank. Stops at the first failing case, on every rank.
pub fn run_suite<C: Collectives + Controller>(
    comm: &mut C,
    opts: &SuiteOptions,
) -> Result<Report, Failure> {
    let mut report = Report::default();
    if opts.controller {
        let cases = check_controller(comm)?;
        report.add("controller", cases);
    }
    check_barrier(comm, 3)?;
    report.add("barrier", 1);
    for &dtype in &opts.dtypes {
        with_element_type!(dtype, T => run_small::<T, C>(comm, opts, &mut report))?;
    }
    if opts.large_bytes > 0 {
        for &dtype in &opts.large_dtypes {
            with_element_type!(dtype, T => run_large::<T, C>(comm, opts.large_bytes, &mut report))?;
        }
    }
    Ok(report)
}

/// Every operation at every small count.
fn run_small<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    opts: &SuiteOptions,
    report: &mut Report,
) -> Result<(), Failure> {
    let n = comm.size();
    for count in small_counts(n) {
        for op in ReduceOp::ALL {
            for scale in [Scale::NONE, SCALED] {
                check_allreduce::<T, C>(comm, count, op, scale)?;
                report.add("allreduce", 1);
            }
        }
        let uneven = uneven_counts(count, n);
        for op in ReduceOp::ALL {
            check_reduce_scatter::<T, C>(comm, &uneven, op, Scale::NONE)?;
        }
        check_reduce_scatter::<T, C>(comm, &vec![count; n], ReduceOp::Average, SCALED)?;
        report.add("reduce_scatter", ReduceOp::ALL.len() + 1);
        check_allgatherv::<T, C>(comm, &uneven)?;
        check_allgatherv::<T, C>(comm, &vec![count; n])?;
        report.add("allgatherv", 2);
        for root in 0..n {
            check_broadcast::<T, C>(comm, count, root)?;
        }
        report.add("broadcast", n);
        check_alltoallv::<T, C>(comm, count)?;
        report.add("alltoallv", 1);
        if opts.unordered_p2p {
            check_send_recv::<T, C>(comm, count)?;
            report.add("send_recv", 1);
        }
        check_sendrecv::<T, C>(comm, count)?;
        report.add("sendrecv", 1);
        check_transaction::<T, C>(comm, count)?;
        report.add("transaction", 1);
    }
    for lens in small_segment_layouts(n) {
        for op in ReduceOp::ALL {
            for scale in [Scale::NONE, SCALED] {
                check_allreduce_segments::<T, C>(comm, &lens, op, scale)?;
                report.add("allreduce_segments", 1);
            }
        }
    }
    Ok(())
}

/// Every operation once with about `bytes` of data.
fn run_large<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    bytes: usize,
    report: &mut Report,
) -> Result<(), Failure> {
    let n = comm.size();
    let count = (bytes / std::mem::size_of::<T>()).max(1);
    let per_rank = count / n;
    check_allreduce::<T, C>(comm, count, ReduceOp::Sum, SCALED)?;
    report.add("allreduce", 1);
    check_allreduce_segments::<T, C>(comm, &MANY_SEGMENTS, ReduceOp::Sum, Scale::NONE)?;
    check_allreduce_segments::<T, C>(comm, &uneven_segments(count), ReduceOp::Average, SCALED)?;
    report.add("allreduce_segments", 2);
    check_reduce_scatter::<T, C>(
        comm,
        &uneven_counts(per_rank, n),
        ReduceOp::Sum,
        Scale::NONE,
    )?;
    report.add("reduce_scatter", 1);
    check_allgatherv::<T, C>(comm, &uneven_counts(per_rank, n))?;
    report.add("allgatherv", 1);
    check_broadcast::<T, C>(comm, count, n - 1)?;
    report.add("broadcast", 1);
    check_alltoallv::<T, C>(comm, per_rank)?;
    report.add("alltoallv", 1);
    check_sendrecv::<T, C>(comm, count)?;
    report.add("sendrecv", 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_counts_cover_the_edges() {
        assert_eq!(small_counts(1), vec![0, 1, 3, MEDIUM_COUNT]);
        assert_eq!(small_counts(4), vec![0, 1, 3, 9, MEDIUM_COUNT]);
        assert!(small_counts(8).iter().any(|c| c % 8 != 0));
    }

    #[test]
    fn segment_layouts_cover_none_one_and_the_small_counts() {
        let layouts = small_segment_layouts(4);
        assert_eq!(layouts[0], Vec::<usize>::new());
        assert_eq!(layouts[1], vec![9]);
        assert_eq!(layouts[2], vec![MEDIUM_COUNT, 9, 3, 1, 0, 0]);
    }

    #[test]
    fn report_counts_per_operation() {
        let mut report = Report::default();
        report.add("allreduce", 3);
        report.add("barrier", 1);
        report.add("allreduce", 2);
        assert_eq!(report.cases, 6);
        assert_eq!(report.to_string(), "6 cases: allreduce 5, barrier 1");
    }
}
