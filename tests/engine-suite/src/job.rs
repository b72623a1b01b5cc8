//! Jobs: ranks, configuration and the cases they run; and the case lists.

use crate::{
    equivalence, join, mismatch, ops, orders, refused, sets, shutdown, stall, timeline, Case,
};
use kolo::Config;
use std::path::{Path, PathBuf};

/// Every case of the main sequence, in order, without the final shutdown
/// (see [`Job::main`]). Tensor names are distinct across cases, so that
/// one engine runs them all.
const MAIN: &[Case] = &[
    Case::new("allreduce_every_op", ops::allreduces),
    Case::new("half_precision_and_bool", ops::half_precision_and_bool),
    Case::new("compressed_allreduces", ops::compressed_allreduces),
    Case::new("allgather_uneven", ops::allgathers),
    Case::new("broadcast", ops::broadcasts),
    Case::new("reduce_scatter", ops::reduce_scatters),
    Case::new("alltoall", ops::alltoalls),
    Case::new("group_and_barrier", ops::group_and_barrier),
    Case::new("release_buffers", ops::release_buffers),
    Case::new(
        "shuffled_submission_orders",
        ops::shuffled_submission_orders,
    ),
    Case::new(
        "handles_wait_poll_and_await",
        ops::handles_wait_poll_and_await,
    ),
    Case::new("several_user_threads", ops::several_user_threads),
    Case::new("scoped_allreduces", ops::scoped_allreduces),
    Case::new("tensor_groups", ops::tensor_groups),
    Case::new("group_after_cache_reuse", orders::group_after_cache_reuse),
    Case::new("group_rules", ops::group_rules),
    Case::new("mismatch_matrix", mismatch::the_mismatch_matrix),
    Case::new(
        "name_in_flight_rejected",
        mismatch::a_name_in_flight_is_rejected,
    ),
    Case::new("local_argument_errors", mismatch::local_argument_errors),
    Case::new("tensor_group_errors", mismatch::tensor_group_errors),
    Case::new(
        "refused_tensor_alone_is_untouched",
        refused::refused_tensor_alone_is_untouched,
    ),
    Case::new("alltoall_bad_splits", mismatch::alltoall_bad_splits),
    Case::new("join_uneven_batches", join::uneven_batches_then_join),
    Case::new("join_twice", join::join_twice),
    Case::new(
        "joined_rank_in_rs_and_allgather",
        join::joined_rank_in_rs_and_allgather,
    ),
    Case::new("fusion_equals_unfused", equivalence::fusion_equals_unfused),
    Case::new("workload", equivalence::workload),
    Case::new(
        "warm_cache_gathers_nothing",
        equivalence::warm_cache_gathers_nothing,
    ),
    Case::new(
        "repeated_steps_any_submission",
        equivalence::repeated_steps_any_submission,
    ),
    Case::new("timeline_operations", timeline::operations),
    Case::new(
        "sets_disjoint_and_overlapping",
        sets::disjoint_and_overlapping,
    ),
    Case::new(
        "sets_never_block_one_another",
        sets::never_block_one_another,
    ),
    Case::new("sets_errors_name_the_set", sets::errors_name_the_set),
];

/// The last case of [`Job::main`]: rank 0 shuts down while the others
/// have an operation pending.
const SHUTDOWN: Case = Case::new(
    "shutdown_fails_pending_handles",
    shutdown::shutdown_fails_pending_handles,
);

/// The gradient-like workload alone (for jobs that vary the configuration
/// and compare digests with a main job).
pub const WORKLOAD: &[Case] = &[Case::new("workload", equivalence::workload)];

/// Every submission style against every other, in any order and split
/// (see [`order_jobs`] for the settings it runs under).
pub const ORDERS: &[Case] = &[
    Case::new("any_order_any_style", orders::any_order_any_style),
    Case::new("group_after_cache_reuse", orders::group_after_cache_reuse),
];

/// [`ORDERS`] at each of `ranks`, under every combination of fusion on
/// and off, the response cache on and off, and a timeline on and off
/// (`orders_np{ranks}_{settings}`). Results must be bit-identical across
/// the settings of one rank count (see [`crate::compare_digests`]).
pub fn order_jobs(ranks: &[usize]) -> Vec<Job> {
    type Settings = fn(Config) -> Config;
    let settings: [(&str, Settings); 4] = [
        ("defaults", |c| c),
        ("no_fusion", |c| c.fusion_threshold(0)),
        ("no_cache", |c| c.cache_capacity(0)),
        ("neither", |c| c.fusion_threshold(0).cache_capacity(0)),
    ];
    let mut jobs = Vec::new();
    for &np in ranks {
        for (name, settings) in settings {
            for timeline in [false, true] {
                let suffix = if timeline { "_timeline" } else { "" };
                let mut cases = ORDERS.to_vec();
                if timeline {
                    // What the judge then looks for in the timeline.
                    cases.push(Case::new("timeline_operations", timeline::operations));
                }
                let job = Job::new(format!("orders_np{np}_{name}{suffix}"), np, cases)
                    .with_settings(settings);
                jobs.push(if timeline { job.with_timeline() } else { job });
            }
        }
    }
    jobs
}

/// The stall inspector's cases (see [`Job::stall`]); the second shuts the
/// engine down, so it comes last.
pub const STALL: &[Case] = &[
    Case::new(
        "stall_warning_names_the_late_rank",
        stall::late_rank_warning,
    ),
    Case::new(
        "stall_shutdown_fails_the_withheld_tensor",
        stall::withheld_tensor,
    ),
];

/// The operation timeout's case (see [`Job::timeout`]): it stops the
/// engine.
pub const TIMEOUT: &[Case] = &[Case::new(
    "timeout_fails_the_withheld_tensor_naming_the_rank",
    stall::withheld_tensor_times_out,
)];

/// The names of the main sequence with `extra` cases (a backend's own)
/// before the final shutdown.
pub fn main_cases(extra: &[Case]) -> Vec<Case> {
    MAIN.iter()
        .chain(extra)
        .chain([&SHUTDOWN])
        .copied()
        .collect()
}

/// One job: `ranks` ranks, each with an engine configured by
/// [`Job::configure`], running `cases` in order.
#[derive(Clone, Debug)]
pub struct Job {
    /// The job's name, the prefix of its verdicts.
    pub name: String,
    /// Ranks (threads, or `mpirun -np`).
    pub ranks: usize,
    /// What every rank runs, in order.
    pub cases: Vec<Case>,
    /// Whether rank 0 writes a timeline that [`crate::judge`] checks.
    pub timeline: bool,
    /// Changes to the backend's base configuration.
    pub settings: fn(Config) -> Config,
}

impl Job {
    /// A job without a timeline or settings of its own.
    pub fn new(name: impl Into<String>, ranks: usize, cases: Vec<Case>) -> Job {
        Job {
            name: name.into(),
            ranks,
            cases,
            timeline: false,
            settings: |config| config,
        }
    }

    /// The main sequence (with the backend's `extra` cases before the
    /// shutdown) on `ranks` ranks, with a timeline: `main_np{ranks}`.
    pub fn main(ranks: usize, extra: &[Case]) -> Job {
        Job::new(format!("main_np{ranks}"), ranks, main_cases(extra)).with_timeline()
    }

    /// [`STALL`] on `ranks` ranks (at least 3), with the stall warning
    /// after 100 ms and the stall shutdown after 1 s: `stall_np{ranks}`.
    pub fn stall(ranks: usize) -> Job {
        Job::new(format!("stall_np{ranks}"), ranks, STALL.to_vec()).with_settings(stall::settings)
    }

    /// [`TIMEOUT`] on `ranks` ranks (at least 2), with operations
    /// bounded to 1 s and no stall shutdown: `timeout_np{ranks}`.
    pub fn timeout(ranks: usize) -> Job {
        Job::new(format!("timeout_np{ranks}"), ranks, TIMEOUT.to_vec())
            .with_settings(stall::timeout_settings)
    }

    /// Rank 0 writes a timeline (with cycle marks) that the judge checks.
    pub fn with_timeline(mut self) -> Job {
        self.timeline = true;
        self
    }

    /// Applies `settings` to the base configuration.
    pub fn with_settings(mut self, settings: fn(Config) -> Config) -> Job {
        self.settings = settings;
        self
    }

    /// Where rank 0 writes this job's timeline, in directory `dir`.
    pub fn timeline_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.timeline.json", self.name))
    }

    /// The configuration of every rank: `base` with this job's settings
    /// (and its timeline in `dir`).
    pub fn configure(&self, base: Config, dir: &Path) -> Config {
        let config = (self.settings)(base);
        if self.timeline {
            config
                .timeline(self.timeline_path(dir))
                .timeline_mark_cycles(true)
        } else {
            config
        }
    }
}
