//! Autotuning (Horovod's `HOROVOD_AUTOTUNE`, off by default; on with
//! `KOLO_AUTOTUNE=1` or [`crate::Config::autotune`]): the fusion threshold
//! and cycle time chosen by measurement during the first training steps,
//! then fixed.
//!
//! - [`windows`] splits the cycles into sample windows of whole steps,
//!   from the tensors they performed, which every rank has alike;
//! - [`search`] is the tuner: a coordinate search over a small grid, fed
//!   one score per window (bytes performed per second), pure;
//! - [`shell`] runs them in the engine's cycle: rank 0 times each window,
//!   scores it and decides, and at each window's end (the same cycle on
//!   every rank) broadcasts the setting every rank then uses, so that the
//!   fusion plans, computed by each rank alone, still agree.
//!
//! The state is visible through [`crate::Kolo::autotune`].

pub(crate) mod search;
pub(crate) mod shell;
#[cfg(test)]
mod tests;
pub(crate) mod windows;

pub use search::Candidate;
use std::time::Duration;

/// Where the autotuner stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutotunePhase {
    /// Not asked for ([`crate::Config::autotune`] is off): the configured
    /// settings hold.
    Off,
    /// Measuring: the settings change from window to window.
    Tuning,
    /// Done: the settings are fixed for the engine's life.
    Settled,
}

/// The scores of one candidate, as rank 0's tuner measured it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CandidateScore {
    /// The setting measured.
    pub candidate: Candidate,
    /// The median of its windows' bytes performed per second.
    pub bytes_per_second: f64,
    /// The median of its windows' scores divided by the configured
    /// setting's in the same pass over the candidates (1 for the
    /// configured setting): what the tuner compares, and keeps the
    /// highest of.
    pub relative: f64,
}

/// A snapshot of this rank's autotuner ([`crate::Kolo::autotune`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Autotune {
    /// Off, tuning or settled.
    pub phase: AutotunePhase,
    /// The fusion threshold in effect now, in bytes (every rank uses the
    /// same from the same cycle on).
    pub fusion_threshold: usize,
    /// The cycle time in effect now.
    pub cycle_time: Duration,
    /// Sample windows run so far (every rank counts the same).
    pub samples: usize,
    /// Rank 0: each candidate measured so far with its score, in the order
    /// measured, the configured setting first. Empty on other ranks.
    pub scores: Vec<CandidateScore>,
}

impl Autotune {
    /// The state of an engine configured with `threshold` and `cycle_time`,
    /// before its first cycle: `Tuning` if asked for, else `Off`.
    pub(crate) fn configured(threshold: usize, cycle_time: Duration, tune: bool) -> Autotune {
        Autotune {
            phase: if tune {
                AutotunePhase::Tuning
            } else {
                AutotunePhase::Off
            },
            fusion_threshold: threshold,
            cycle_time,
            samples: 0,
            scores: Vec::new(),
        }
    }

    /// The settings in effect.
    pub fn candidate(&self) -> Candidate {
        Candidate {
            fusion_threshold: self.fusion_threshold,
            cycle_time: self.cycle_time,
        }
    }

    /// The scores rank 0 measured for `candidate`, if it measured it.
    pub fn score_of(&self, candidate: Candidate) -> Option<CandidateScore> {
        self.scores
            .iter()
            .find(|s| s.candidate == candidate)
            .copied()
    }
}
