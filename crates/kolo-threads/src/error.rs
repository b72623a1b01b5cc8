//! Errors of the threads backend: creating communicators and running ranks.

use std::fmt;
use thiserror::Error;

/// Why [`crate::communicators`] could not build a communicator.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ThreadsError {
    /// A communicator needs at least one rank.
    #[error("a communicator needs at least one rank, got {requested}")]
    NoRanks {
        /// The number of ranks asked for (0).
        requested: usize,
    },
}

/// How one rank of [`crate::run`] ended badly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFailure {
    /// The rank that failed.
    pub rank: usize,
    /// Its error's `Display`, or its panic message.
    pub message: String,
    /// True if the rank panicked rather than returning an error.
    pub panicked: bool,
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.panicked { "panicked" } else { "failed" };
        write!(f, "rank {} {how}: {}", self.rank, self.message)
    }
}

/// The ranks of a [`crate::run`] that failed.
///
/// `failures` lists root causes first (ranks that failed on their own: a
/// panic, or an error that did not come from a peer's failure), then the
/// ranks that failed merely because a peer did; each group in rank order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunError {
    /// Every failed rank, root causes first.
    pub failures: Vec<RankFailure>,
}

impl RunError {
    /// Orders `failures` (each flagged `true` when it merely followed a
    /// peer's failure) root causes first.
    pub(crate) fn from_outcomes(mut failures: Vec<(RankFailure, bool)>) -> Self {
        failures.sort_by_key(|(failure, followed_peer)| (*followed_peer, failure.rank));
        RunError {
            failures: failures.into_iter().map(|(failure, _)| failure).collect(),
        }
    }

    /// The first root cause (or, if every rank merely saw a peer fail, the
    /// lowest failed rank).
    pub fn root_cause(&self) -> Option<&RankFailure> {
        self.failures.first()
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((first, rest)) = self.failures.split_first() else {
            return f.write_str("no rank failed");
        };
        write!(f, "{first}")?;
        if !rest.is_empty() {
            f.write_str("; then ")?;
            for (i, failure) in rest.iter().enumerate() {
                if i > 0 {
                    f.write_str("; ")?;
                }
                write!(f, "{failure}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for RunError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(rank: usize, message: &str, panicked: bool) -> RankFailure {
        RankFailure {
            rank,
            message: message.to_string(),
            panicked,
        }
    }

    #[test]
    fn root_causes_come_first_in_rank_order() {
        let err = RunError::from_outcomes(vec![
            (failure(0, "rank 2 failed: boom", false), true),
            (failure(3, "disk full", false), false),
            (failure(2, "boom", true), false),
            (failure(1, "rank 2 failed: boom", false), true),
        ]);
        let ranks: Vec<usize> = err.failures.iter().map(|f| f.rank).collect();
        assert_eq!(ranks, [2, 3, 0, 1]);
        assert_eq!(err.root_cause().map(|f| f.rank), Some(2));
        assert_eq!(
            err.to_string(),
            "rank 2 panicked: boom; then rank 3 failed: disk full; \
             rank 0 failed: rank 2 failed: boom; rank 1 failed: rank 2 failed: boom"
        );
    }

    #[test]
    fn single_failure_displays_alone() {
        let err = RunError::from_outcomes(vec![(failure(1, "bad", false), false)]);
        assert_eq!(err.to_string(), "rank 1 failed: bad");
        assert_eq!(RunError { failures: vec![] }.to_string(), "no rank failed");
    }

    #[test]
    fn threads_error_names_the_count() {
        let err = ThreadsError::NoRanks { requested: 0 };
        assert_eq!(
            err.to_string(),
            "a communicator needs at least one rank, got 0"
        );
    }
}
