//! kolo-engine-suite: one test suite for kolo's engine (the `kolo` facade:
//! negotiation, fusion, the response cache, join, the stall inspector,
//! the timeline, shutdown), written against the public API, that every
//! backend runs: kolo-threads' ranks (`crates/kolo/tests/engine_suite.rs`)
//! and MPI processes under `mpirun` (`crates/kolo-mpi/tests/engine.rs`).
//!
//! The unit is a [`Job`]: a number of ranks, a configuration and a
//! sequence of [`Case`]s that every rank runs in order on one engine
//! (cases are SPMD functions of the engine, with exact expected results
//! for any number of ranks). A backend's runner only starts the ranks:
//!
//! 1. it starts `job.ranks` engines with [`Job::configure`]'s config (over
//!    the backend's base config) and on each calls [`run_rank`], which
//!    reports a [`CaseLine`] per case (as values, or as text lines that
//!    [`CaseLine::parse`] reads back when the ranks are processes);
//! 2. it hands every rank's lines to [`judge`], which gives one [`Verdict`]
//!    per case (every rank passed it, and result digests agree across
//!    ranks) and checks the job's timeline file (with the fusion buffer's
//!    copies if the backend packs fused allreduces: MPI does, kolo-threads
//!    reduces the tensors in place);
//! 3. [`compare_digests`] checks that two jobs that differ only in how
//!    results are reached (cache, fusion, thread level) reached the same
//!    results.
//!
//! The job lists: [`main_cases`] (every operation, the mismatch matrix,
//! random submission orders, join, the cache and fusion, the timeline,
//! then a shutdown with pending handles), [`WORKLOAD`] (for config
//! variants), [`STALL`] (the stall warning, then the stall shutdown), and
//! [`failure::train`] for a rank that fails mid-training.
//!
//! # Example
//!
//! ```
//! use kolo_engine_suite::{judge, run_rank, Job, WORKLOAD};
//!
//! let job = Job::new("workload_np2", 2, WORKLOAD.to_vec());
//! let dir = std::env::temp_dir();
//! let lines = kolo::threads::run(2, job.configure(kolo::Config::default(), &dir), |kolo| {
//!     let mut lines = Vec::new();
//!     let _ = run_rank(kolo, &job.cases, &mut |line| lines.push(line));
//!     Ok(lines)
//! })?;
//! let lines: Vec<_> = lines.into_iter().flatten().collect();
//! // kolo-threads reduces fused allreduces in place: it does not pack.
//! assert!(judge(&job, &lines, &dir, false).iter().all(|v| v.failure.is_none()));
//! # Ok::<(), kolo::Error>(())
//! ```

#![warn(missing_docs)]

mod equivalence;
pub mod failure;
mod job;
mod join;
pub mod memory;
mod mismatch;
mod ops;
mod orders;
mod refused;
mod report;
mod rng;
mod sets;
mod shutdown;
pub mod stall;
mod timeline;

pub use job::{main_cases, order_jobs, Job, ORDERS, STALL, TIMEOUT, WORKLOAD};
pub use orders::{any_order_any_style_in, group_after_cache_reuse_in};
pub use refused::refused_tensor_alone_is_untouched_in;
pub use report::{
    compare_digests, digest, judge, panic_text, run_rank, CaseLine, Verdict, CASE_MARKER,
};
pub use rng::Rng;

use kolo::{Error, Kolo};

/// What a case returns on success: a digest of its results where they
/// must not depend on the configuration (see [`compare_digests`]).
pub type Digest = Option<u64>;

/// One case: runs on every rank of the job, in the same order; fails with
/// an error or a panic (its assertions).
pub type CaseFn = fn(&Kolo) -> Result<Digest, Error>;

/// A named case of the suite.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The name reported (`job::name`); no spaces.
    pub name: &'static str,
    /// The body every rank runs.
    pub body: CaseFn,
}

impl Case {
    /// A case named `name` running `body`.
    pub const fn new(name: &'static str, body: CaseFn) -> Case {
        Case { name, body }
    }
}

/// Allreduces each of `bufs` as its name in `names`, one asynchronous
/// call each in one scope, and waits for them all (the first error).
pub(crate) fn allreduce_each<'b, T: kolo::Element>(
    kolo: &Kolo,
    names: &[String],
    bufs: impl IntoIterator<Item = &'b mut Vec<T>>,
    op: kolo::ReduceOp,
) -> Result<(), Error> {
    kolo.scope(|s| {
        let handles = names
            .iter()
            .zip(bufs)
            .map(|(name, buf)| s.allreduce_async(name, buf, op))
            .collect::<Result<Vec<_>, _>>()?;
        handles.into_iter().try_for_each(|h| h.wait())
    })
}

/// The error of a result that must have failed (panics, as an assertion,
/// on `Ok`).
pub fn expect_err<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) -> Error {
    match result {
        Ok(v) => panic!("{what}: expected an error, got Ok({v:?})"),
        Err(e) => e,
    }
}
