//! kolo-conformance: one conformance suite for kolo's collectives, written
//! against the traits of `kolo-transport`, that every backend runs (threads,
//! MPI, NCCL through host staging and on device memory, UCX, ...), on any
//! memory the backend works on.
//!
//! Every rank calls the same entry points in the same order. Each case
//! fills its inputs deterministically from (case, rank, index), so every
//! rank can compute the sequential reference for its own result from
//! everyone's known inputs, checks it (bit for bit for integers, bool and
//! data movement; within a few ulps for float reductions), and then agrees
//! with the other ranks on the outcome, so that a failure stops every rank
//! at the same case instead of leaving the healthy ones in the next
//! collective. A [`Failure`] names the case, the rank, the index, the
//! expected and the received value.
//!
//! - [`run_suite`]: everything (every operation, every dtype, counts 0, 1,
//!   n-1, 2n+1, 1021 and one large case of 4 MiB per operation for a few
//!   dtypes, the control plane; `allreduce_segments` over no segments, one,
//!   segments of those counts, 1,000 segments of 1,024 elements and 4 MiB
//!   of uneven segments; a fused buffer's pack and unpack).
//! - [`run_suite_on`]: the same on any [`kolo_transport::Memory`], e.g.
//!   `run_suite_on::<Cuda, _>` for kolo-nccl's device data plane: inputs
//!   are uploaded with `buffer_from`, results read back with `read_buffer`
//!   after `synchronize`. [`SuiteOptions::unsupported_reductions`] names
//!   the dtypes a backend cannot reduce; their reductions must then fail
//!   as `Unsupported` (and are counted apart in the [`Report`]).
//! - `check_*`: one case of one operation, for finer-grained `#[test]`s
//!   (`check_*_on::<M, ..>` on any memory).
//! - [`random_cases_strategy`] / [`random_cases`] and [`run_random_cases`]:
//!   random sequences of collectives for property tests.
//! - [`mailbox`]: a minimal reference backend, used to test the suite itself.
//!
//! # Example
//!
//! ```
//! use kolo_conformance::{mailbox, run_suite, Failure, SuiteOptions};
//! use kolo_protocol::DataType;
//!
//! let opts = SuiteOptions { dtypes: vec![DataType::F32, DataType::I64], ..SuiteOptions::quick() };
//! let results = mailbox::run(3, |comm| run_suite(comm, &opts));
//! for result in results {
//!     let report = result?;
//!     assert!(report.per_operation["allreduce"] > 0);
//! }
//! # Ok::<(), Failure>(())
//! ```

#![warn(missing_docs)]

mod buffers;
mod checks;
mod failure;
pub mod mailbox;
mod random;
mod reference;
mod suite;
mod values;

pub use checks::{
    check_allgather_bytes, check_allgatherv, check_allgatherv_on, check_allreduce,
    check_allreduce_on, check_allreduce_segments, check_allreduce_segments_on, check_alltoallv,
    check_alltoallv_on, check_barrier, check_barrier_counter, check_barrier_counter_on,
    check_barrier_on, check_bitwise_allreduce, check_broadcast, check_broadcast_bytes,
    check_broadcast_on, check_control_barrier, check_controller, check_gather_bytes,
    check_pack_unpack, check_pack_unpack_on, check_reduce_scatter, check_reduce_scatter_on,
    check_send_recv, check_send_recv_on, check_sendrecv, check_sendrecv_on, check_transaction,
    check_transaction_on,
};
pub use failure::Failure;
pub use random::{
    random_case, random_cases, random_cases_strategy, run_random_cases, run_random_cases_on,
    RandomCase, RandomOp,
};
pub use suite::{
    run_suite, run_suite_on, small_counts, small_segment_layouts, Report, SuiteOptions,
    MANY_SEGMENTS, MEDIUM_COUNT,
};
pub use values::{alltoall_count, uneven_counts, uneven_segments};
