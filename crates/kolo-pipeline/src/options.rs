//! How a pipeline run is set up: its direction of travel, its mode and its
//! length.

use crate::error::PlanError;
use std::fmt;

/// Which way a tensor travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Activations, from the producing stage to the consuming stage.
    Forward,
    /// Gradients, from the consuming stage back to the producing stage.
    Backward,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Forward => "forward",
            Direction::Backward => "backward",
        })
    }
}

/// Training (activations forward, gradients backward) or inference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Activations go forward and gradients come back.
    Training,
    /// Only activations go forward; the receiver acknowledges each message
    /// it takes, and a sender never has more than `window` unacknowledged
    /// messages on one link: the acks are the pipeline's clock, so an early
    /// stage cannot run arbitrarily far ahead of a slow one.
    ForwardOnly {
        /// Messages in flight per link (at least 1).
        window: usize,
    },
}

/// What one pipeline run does: its mode and how many minibatches flow.
///
/// Minibatches are numbered `0..iterations` across the whole pipeline;
/// replica `g % width` of each stage processes minibatch `g` (see
/// [`crate::schedule`]). Every helper thread moves exactly the messages of
/// its link for that many minibatches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// Minibatches in the run.
    pub iterations: u64,
    /// Training or forward-only.
    pub mode: Mode,
}

impl Options {
    /// A training run of `iterations` minibatches.
    pub fn training(iterations: u64) -> Self {
        Options {
            iterations,
            mode: Mode::Training,
        }
    }

    /// A forward-only run of `iterations` minibatches with at most `window`
    /// unacknowledged messages per link.
    pub fn forward_only(iterations: u64, window: usize) -> Self {
        Options {
            iterations,
            mode: Mode::ForwardOnly { window },
        }
    }

    /// True in forward-only mode.
    pub fn is_forward_only(&self) -> bool {
        matches!(self.mode, Mode::ForwardOnly { .. })
    }

    /// The forward-only window, `None` in training.
    pub fn window(&self) -> Option<usize> {
        match self.mode {
            Mode::ForwardOnly { window } => Some(window),
            Mode::Training => None,
        }
    }

    /// An error if the options cannot run (a zero window).
    pub fn validate(&self) -> Result<(), PlanError> {
        match self.mode {
            Mode::ForwardOnly { window: 0 } => Err(PlanError::ZeroWindow),
            _ => Ok(()),
        }
    }
}
