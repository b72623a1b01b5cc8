//! The whole suite: a deterministic sequence of cases, the same on every
//! rank.

use crate::buffers::Expect;
use crate::checks::{
    allreduce_case, allreduce_segments_case, check_allgatherv_on, check_alltoallv_on,
    check_barrier_on, check_broadcast_on, check_controller, check_pack_unpack_on,
    check_send_recv_on, check_sendrecv_on, reduce_scatter_case, transaction_case,
};
use crate::failure::Failure;
use crate::values::{uneven_counts, uneven_segments};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{with_element_type, Collectives, Controller, Element, Host, Memory, Scale};
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
    /// Data types the backend cannot reduce (NCCL has no 16-bit integers,
    /// for one). Every reduction case of these (allreduce,
    /// allreduce_segments, reduce_scatter, and the transaction, which
    /// reduce-scatters) must fail with
    /// [`TransportError::Unsupported`](kolo_transport::TransportError::Unsupported)
    /// naming the dtype, before anything runs, and is counted in
    /// [`Report::unsupported`]; the data movement of these types runs as
    /// usual. Default: none.
    pub unsupported_reductions: Vec<DataType>,
}

impl Default for SuiteOptions {
    fn default() -> Self {
        SuiteOptions {
            dtypes: DataType::ALL.to_vec(),
            large_bytes: 4 << 20,
            large_dtypes: vec![DataType::F32, DataType::BF16, DataType::I64, DataType::U8],
            controller: true,
            unordered_p2p: true,
            unsupported_reductions: Vec::new(),
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
    /// Cases run (those in `unsupported` included).
    pub cases: usize,
    /// Cases per operation name whose results were checked.
    pub per_operation: BTreeMap<&'static str, usize>,
    /// Cases per operation name that checked the backend's `Unsupported`
    /// error instead ([`SuiteOptions::unsupported_reductions`]).
    pub unsupported: BTreeMap<&'static str, usize>,
}

impl Report {
    /// Counts `cases` more cases of `operation`.
    pub fn add(&mut self, operation: &'static str, cases: usize) {
        self.cases += cases;
        *self.per_operation.entry(operation).or_default() += cases;
    }

    /// Counts `cases` more cases of `operation` that the backend refused
    /// as unsupported, as expected.
    pub fn add_unsupported(&mut self, operation: &'static str, cases: usize) {
        self.cases += cases;
        *self.unsupported.entry(operation).or_default() += cases;
    }

    fn add_as(&mut self, expect: Expect, operation: &'static str, cases: usize) {
        match expect {
            Expect::Result => self.add(operation, cases),
            Expect::Unsupported => self.add_unsupported(operation, cases),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cases", self.cases)?;
        for (i, (operation, cases)) in self.per_operation.iter().enumerate() {
            write!(f, "{} {operation} {cases}", if i == 0 { ":" } else { "," })?;
        }
        for (i, (operation, cases)) in self.unsupported.iter().enumerate() {
            let lead = if i == 0 {
                "; refused as unsupported:"
            } else {
                ","
            };
            write!(f, "{lead} {operation} {cases}")?;
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

/// Runs the whole suite on `comm`'s host data plane. Call it on every
/// rank of the communicator with the same options: the cases come in the
/// same order on every rank. Stops at the first failing case, on every
/// rank.
pub fn run_suite<C: Collectives + Controller>(
    comm: &mut C,
    opts: &SuiteOptions,
) -> Result<Report, Failure> {
    run_suite_on::<Host, C>(comm, opts)
}

/// [`run_suite`] on memory `M` (`run_suite_on::<Cuda, _>` for a device
/// backend): every case's inputs are uploaded with `buffer_from`, its
/// results read back with `read_buffer` after `synchronize`.
pub fn run_suite_on<M: Memory, C: Collectives<M> + Controller>(
    comm: &mut C,
    opts: &SuiteOptions,
) -> Result<Report, Failure> {
    let mut report = Report::default();
    if opts.controller {
        let cases = check_controller(comm)?;
        report.add("controller", cases);
    }
    check_barrier_on::<M, C>(comm, 3)?;
    report.add("barrier", 1);
    for &dtype in &opts.dtypes {
        let reduce = Expect::unsupported_if(opts.unsupported_reductions.contains(&dtype));
        with_element_type!(dtype, T => run_small::<M, T, C>(comm, opts, reduce, &mut report))?;
    }
    if opts.large_bytes > 0 {
        for &dtype in &opts.large_dtypes {
            let reduce = Expect::unsupported_if(opts.unsupported_reductions.contains(&dtype));
            with_element_type!(dtype, T => run_large::<M, T, C>(comm, opts.large_bytes, reduce, &mut report))?;
        }
    }
    Ok(report)
}

/// Every operation at every small count; the reductions as `reduce` says.
fn run_small<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    opts: &SuiteOptions,
    reduce: Expect,
    report: &mut Report,
) -> Result<(), Failure> {
    let n = comm.size();
    for count in small_counts(n) {
        for op in ReduceOp::ALL {
            for scale in [Scale::NONE, SCALED] {
                allreduce_case::<M, T, C>(comm, count, op, scale, reduce)?;
                report.add_as(reduce, "allreduce", 1);
            }
        }
        let uneven = uneven_counts(count, n);
        for op in ReduceOp::ALL {
            reduce_scatter_case::<M, T, C>(comm, &uneven, op, Scale::NONE, reduce)?;
        }
        let even = vec![count; n];
        reduce_scatter_case::<M, T, C>(comm, &even, ReduceOp::Average, SCALED, reduce)?;
        report.add_as(reduce, "reduce_scatter", ReduceOp::ALL.len() + 1);
        check_allgatherv_on::<M, T, C>(comm, &uneven)?;
        check_allgatherv_on::<M, T, C>(comm, &even)?;
        report.add("allgatherv", 2);
        for root in 0..n {
            check_broadcast_on::<M, T, C>(comm, count, root)?;
        }
        report.add("broadcast", n);
        check_alltoallv_on::<M, T, C>(comm, count)?;
        report.add("alltoallv", 1);
        if opts.unordered_p2p {
            check_send_recv_on::<M, T, C>(comm, count)?;
            report.add("send_recv", 1);
        }
        check_sendrecv_on::<M, T, C>(comm, count)?;
        report.add("sendrecv", 1);
        transaction_case::<M, T, C>(comm, count, reduce)?;
        report.add_as(reduce, "transaction", 1);
    }
    check_pack_unpack_on::<M, T, C>(comm, &small_counts(n))?;
    report.add("pack_unpack", 1);
    for lens in small_segment_layouts(n) {
        for op in ReduceOp::ALL {
            for scale in [Scale::NONE, SCALED] {
                allreduce_segments_case::<M, T, C>(comm, &lens, op, scale, reduce)?;
                report.add_as(reduce, "allreduce_segments", 1);
            }
        }
    }
    Ok(())
}

/// Every operation once with about `bytes` of data; the reductions as
/// `reduce` says.
fn run_large<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    bytes: usize,
    reduce: Expect,
    report: &mut Report,
) -> Result<(), Failure> {
    let n = comm.size();
    let count = (bytes / std::mem::size_of::<T>()).max(1);
    let per_rank = count / n;
    allreduce_case::<M, T, C>(comm, count, ReduceOp::Sum, SCALED, reduce)?;
    report.add_as(reduce, "allreduce", 1);
    let many = &MANY_SEGMENTS;
    allreduce_segments_case::<M, T, C>(comm, many, ReduceOp::Sum, Scale::NONE, reduce)?;
    let uneven = uneven_segments(count);
    allreduce_segments_case::<M, T, C>(comm, &uneven, ReduceOp::Average, SCALED, reduce)?;
    report.add_as(reduce, "allreduce_segments", 2);
    let blocks = uneven_counts(per_rank, n);
    reduce_scatter_case::<M, T, C>(comm, &blocks, ReduceOp::Sum, Scale::NONE, reduce)?;
    report.add_as(reduce, "reduce_scatter", 1);
    check_allgatherv_on::<M, T, C>(comm, &blocks)?;
    report.add("allgatherv", 1);
    check_broadcast_on::<M, T, C>(comm, count, n - 1)?;
    report.add("broadcast", 1);
    check_alltoallv_on::<M, T, C>(comm, per_rank)?;
    report.add("alltoallv", 1);
    check_sendrecv_on::<M, T, C>(comm, count)?;
    report.add("sendrecv", 1);
    check_pack_unpack_on::<M, T, C>(comm, &MANY_SEGMENTS)?;
    report.add("pack_unpack", 1);
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
        report.add_unsupported("reduce_scatter", 4);
        report.add_unsupported("allreduce", 1);
        assert_eq!(report.cases, 11);
        assert_eq!(
            report.to_string(),
            "11 cases: allreduce 5, barrier 1; refused as unsupported: allreduce 1, reduce_scatter 4"
        );
    }
}
