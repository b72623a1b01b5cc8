//! The autotuner in the engine's cycle: the thin shell around the pure
//! [`Windows`] and [`Tuner`] that holds the clock and the control plane.
//!
//! Every rank feeds each cycle's performed tensors to its [`Windows`]; a
//! window ends at the same cycle on every rank. There rank 0 scores the
//! window (bytes performed per second, over its own clock) and asks its
//! [`Tuner`] for the next setting, and one broadcast from rank 0 hands it
//! to every rank, which applies it before its next cycle: the fusion plan
//! of every later cycle is computed with the same threshold on every rank.
//! Once settled there are no more broadcasts, and nothing is fed.

use super::search::{Candidate, Decision, Grid, Schedule, Tuner};
use super::windows::Windows;
use super::{Autotune, AutotunePhase, CandidateScore};
use crate::config::{Config, MAX_CYCLE_TIME, MAX_FUSION_THRESHOLD};
use crate::error::Error;
use kolo_protocol::{Response, ResponseKind};
use kolo_transport::{Controller, TransportError};
use std::time::{Duration, Instant};

/// Training steps per sample window: with [`Schedule::default`] (three
/// passes of a discarded and a scored window) and kolo's grid (6
/// thresholds, then at most 4 candidates of 3 cycle times and the
/// configured setting), tuning takes at most 60 windows, 240 steps
/// (Horovod's defaults take about 230).
pub(crate) const STEPS_PER_WINDOW: usize = 4;

/// The version byte of the setting's broadcast.
const MESSAGE_VERSION: u8 = 1;

/// The broadcast's length: version, settled flag, threshold, cycle time.
const MESSAGE_LEN: usize = 2 + 8 + 8;

/// One rank's autotuner.
pub(crate) struct Tuning {
    rank: usize,
    /// This rank's configuration asks for it (every rank's must agree).
    wanted: bool,
    /// The configured setting, measured first.
    configured: Candidate,
    /// The setting in effect.
    current: Candidate,
    /// Windows run.
    samples: usize,
    state: State,
}

enum State {
    /// Not asked for, or before the ranks agreed to tune.
    Idle,
    /// Measuring. Only rank 0 has a tuner.
    Running {
        windows: Windows,
        window_start: Instant,
        tuner: Option<Box<Tuner>>,
    },
    /// Done for good.
    Settled { scores: Vec<CandidateScore> },
}

impl Tuning {
    /// Rank `rank`'s autotuner for `config` (idle until [`Tuning::begin`]).
    pub(crate) fn new(rank: usize, config: &Config) -> Tuning {
        let configured = Candidate {
            fusion_threshold: config.fusion_threshold,
            cycle_time: config.cycle_time,
        };
        Tuning {
            rank,
            wanted: config.autotune,
            configured,
            current: configured,
            samples: 0,
            state: State::Idle,
        }
    }

    /// The largest fusion threshold an engine with `config` may use: the
    /// grid's largest when it tunes (its fusion buffers are sized for it).
    pub(crate) fn largest_threshold(config: &Config) -> usize {
        let configured = Candidate {
            fusion_threshold: config.fusion_threshold,
            cycle_time: config.cycle_time,
        };
        if !config.autotune {
            return config.fusion_threshold;
        }
        Grid::around(configured)
            .thresholds()
            .iter()
            .copied()
            .max()
            .unwrap_or(config.fusion_threshold)
    }

    /// Whether this rank's configuration asks for tuning.
    pub(crate) fn wanted(&self) -> bool {
        self.wanted
    }

    /// Starts measuring at `now` if every rank asked for it (`tune`, agreed
    /// before the first cycle).
    pub(crate) fn begin(&mut self, tune: bool, now: Instant) {
        if !tune {
            return;
        }
        let tuner = (self.rank == 0).then(|| {
            let grid = Grid::around(self.configured);
            let tuner = Tuner::new(grid, self.configured, Schedule::default());
            tracing::debug!(
                "autotune: at most {} windows of {STEPS_PER_WINDOW} steps",
                tuner.bound()
            );
            Box::new(tuner)
        });
        self.state = State::Running {
            windows: Windows::new(STEPS_PER_WINDOW),
            window_start: now,
            tuner,
        };
    }

    /// Whether cycles are still fed to it.
    pub(crate) fn running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    /// Feeds one cycle that started at `started` and performed `work` (its
    /// responses and cache hits). At the end of a window, makes the
    /// setting's broadcast from rank 0 (every rank at the same cycle) and
    /// returns the setting to use from the next cycle on.
    pub(crate) fn after_cycle<'r, C: Controller>(
        &mut self,
        controller: &mut C,
        work: impl Iterator<Item = &'r Response>,
        started: Instant,
    ) -> Result<Option<Candidate>, Error> {
        let State::Running {
            windows,
            window_start,
            tuner,
        } = &mut self.state
        else {
            return Ok(None);
        };
        let mut bytes = 0u64;
        let mut names: Vec<&str> = Vec::new();
        for response in work {
            if matches!(response.kind, ResponseKind::Op(_)) {
                let fused = kolo_fusion::fused_bytes(response);
                bytes = bytes.saturating_add(u64::try_from(fused).unwrap_or(u64::MAX));
            }
            names.extend(response.tensor_names.iter().map(String::as_str));
        }
        let Some(window_bytes) = windows.cycle(names, bytes) else {
            return Ok(None);
        };
        let elapsed = started.saturating_duration_since(*window_start);
        *window_start = started;
        let message = match tuner {
            Some(tuner) => {
                let score = window_bytes as f64 / elapsed.as_secs_f64();
                let decision = tuner.observe(score);
                if matches!(decision, Decision::Settled(_)) {
                    for s in scores_of(tuner) {
                        tracing::debug!(
                            "autotune: fusion threshold {} MiB, cycle time {} ms: {:.1} MB/s, {:.3}x the configured",
                            mib(s.candidate.fusion_threshold),
                            millis(s.candidate.cycle_time),
                            s.bytes_per_second / 1e6,
                            s.relative
                        );
                    }
                }
                encode(decision).to_vec()
            }
            None => Vec::new(),
        };
        let reply = controller
            .broadcast_bytes(&message, 0)
            .map_err(Error::from_transport)?;
        let decision = decode(&reply).map_err(|why| {
            Error::Transport(TransportError::Backend(format!(
                "internal: rank 0's autotune setting could not be read: {why}"
            )))
        })?;
        self.samples += 1;
        self.current = decision.candidate();
        if let Decision::Settled(settled) = decision {
            let scores = tuner.as_ref().map_or_else(Vec::new, |t| scores_of(t));
            if self.rank == 0 {
                tracing::info!(
                    "autotune settled: fusion threshold {} MiB, cycle time {} ms after {} samples",
                    mib(settled.fusion_threshold),
                    millis(settled.cycle_time),
                    self.samples
                );
            }
            self.state = State::Settled { scores };
        }
        Ok(Some(self.current))
    }

    /// Where it stands.
    pub(crate) fn snapshot(&self) -> Autotune {
        let (phase, scores) = match &self.state {
            State::Idle if !self.wanted => (AutotunePhase::Off, Vec::new()),
            State::Idle => (AutotunePhase::Tuning, Vec::new()),
            State::Running { tuner, .. } => (
                AutotunePhase::Tuning,
                tuner.as_ref().map_or_else(Vec::new, |t| scores_of(t)),
            ),
            State::Settled { scores } => (AutotunePhase::Settled, scores.clone()),
        };
        Autotune {
            phase,
            fusion_threshold: self.current.fusion_threshold,
            cycle_time: self.current.cycle_time,
            samples: self.samples,
            scores,
        }
    }
}

/// The tuner's measured candidates as the snapshot shows them.
fn scores_of(tuner: &Tuner) -> Vec<CandidateScore> {
    tuner
        .measured()
        .iter()
        .map(|m| CandidateScore {
            candidate: m.candidate,
            bytes_per_second: m.raw_median(),
            relative: m.relative_median(),
        })
        .collect()
}

/// `bytes` in MiB, as short as exact.
fn mib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// `d` in milliseconds.
fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Rank 0's decision as it travels.
pub(crate) fn encode(decision: Decision) -> [u8; MESSAGE_LEN] {
    let candidate = decision.candidate();
    let mut message = [0u8; MESSAGE_LEN];
    message[0] = MESSAGE_VERSION;
    message[1] = u8::from(matches!(decision, Decision::Settled(_)));
    message[2..10].copy_from_slice(&(candidate.fusion_threshold as u64).to_le_bytes());
    let nanos = u64::try_from(candidate.cycle_time.as_nanos()).unwrap_or(u64::MAX);
    message[10..18].copy_from_slice(&nanos.to_le_bytes());
    message
}

/// Reads [`encode`]'s message; anything else, or a setting out of the
/// configuration's bounds, is an error saying why.
pub(crate) fn decode(message: &[u8]) -> Result<Decision, String> {
    let Ok(message) = <&[u8; MESSAGE_LEN]>::try_from(message) else {
        return Err(format!("{} bytes instead of {MESSAGE_LEN}", message.len()));
    };
    if message[0] != MESSAGE_VERSION {
        return Err(format!(
            "version {} instead of {MESSAGE_VERSION}",
            message[0]
        ));
    }
    let word = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&message[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    let threshold = usize::try_from(word(2))
        .ok()
        .filter(|&t| t <= MAX_FUSION_THRESHOLD)
        .ok_or_else(|| format!("fusion threshold {} out of bounds", word(2)))?;
    let cycle_time = Duration::from_nanos(word(10));
    if cycle_time > MAX_CYCLE_TIME {
        return Err(format!("cycle time {cycle_time:?} out of bounds"));
    }
    let candidate = Candidate {
        fusion_threshold: threshold,
        cycle_time,
    };
    match message[1] {
        0 => Ok(Decision::Try(candidate)),
        1 => Ok(Decision::Settled(candidate)),
        flag => Err(format!("settled flag {flag}")),
    }
}
