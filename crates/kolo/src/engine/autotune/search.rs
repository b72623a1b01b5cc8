//! The search: which (fusion threshold, cycle time) to try next, given the
//! scores of the windows measured so far. Pure: it is fed one score per
//! window and never reads a clock.
//!
//! # Why a coordinate search over a small grid, in interleaved passes
//!
//! Horovod scores throughput over sample windows (warm-up windows
//! discarded) and proposes the next setting by Bayesian optimisation over
//! continuous ranges. kolo searches a grid instead, one axis at a time —
//! every threshold at the configured cycle time, then every cycle time at
//! the best threshold — with the median of several windows per candidate:
//!
//! - the two settings act on different things: the threshold on how the
//!   tensors one cycle agreed are grouped into collectives, the cycle time
//!   only on how often an *idle* rank cycles (a rank with work cycles at
//!   once). Their effects are close to separable, and for a separable
//!   score one sweep per axis finds the grid's best (tested);
//! - it costs `thresholds + cycle_times + 1` candidates rather than their
//!   product, and the number of windows before it settles is known in
//!   advance ([`Tuner::bound`]), which a Gaussian process's stopping rule
//!   is not;
//! - the candidates of an axis are measured in passes, one scored window
//!   each per pass (after a discarded one, since a window's first cycle
//!   still ran with the last setting), the configured setting first in
//!   every pass, as kolo's benchmarks alternate their variants; a
//!   candidate's score in a pass is relative to the configured setting's
//!   in the same pass. A machine whose load drifts (other jobs, a busy
//!   neighbour) then slows the candidates and their reference alike
//!   instead of favouring whichever ran while it was quiet, and scores
//!   from the two axes compare;
//! - the median of a candidate's passes shrugs off the odd slow window (a
//!   page fault, a descheduled thread) that a single sample, or a model
//!   fitted to every sample, would chase;
//! - the configured setting scores 1 in every pass and wins ties, and the
//!   setting kept is the best median of all measured: it scored at least
//!   as well as the configured one.

use std::time::Duration;

/// One setting of the two tuned knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// The fusion threshold, in bytes.
    pub fusion_threshold: usize,
    /// The cycle time.
    pub cycle_time: Duration,
}

/// The values each knob may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    thresholds: Vec<usize>,
    cycle_times: Vec<Duration>,
}

/// The thresholds of [`Grid::around`], besides the configured one: none
/// (every tensor its own collective), then powers of four from 1 MiB up to
/// 64 MiB (Horovod tunes 0 to 64 MiB).
const THRESHOLDS: [usize; 5] = [0, 1 << 20, 4 << 20, 16 << 20, 64 << 20];

/// The cycle times of [`Grid::around`], besides the configured one, in
/// microseconds.
const CYCLE_TIMES_US: [u64; 2] = [250, 5_000];

impl Grid {
    /// A grid of the given values; `start`'s values are added if missing.
    /// Each axis is sorted and without duplicates.
    pub(crate) fn new(
        thresholds: impl IntoIterator<Item = usize>,
        cycle_times: impl IntoIterator<Item = Duration>,
        start: Candidate,
    ) -> Grid {
        let mut thresholds: Vec<usize> = thresholds.into_iter().collect();
        thresholds.push(start.fusion_threshold);
        thresholds.sort_unstable();
        thresholds.dedup();
        let mut cycle_times: Vec<Duration> = cycle_times.into_iter().collect();
        cycle_times.push(start.cycle_time);
        cycle_times.sort_unstable();
        cycle_times.dedup();
        Grid {
            thresholds,
            cycle_times,
        }
    }

    /// kolo's grid around the configured `start`: thresholds of none, 1, 4,
    /// 16 and 64 MiB, cycle times of 0.25 and 5 ms, and `start`'s.
    pub(crate) fn around(start: Candidate) -> Grid {
        Grid::new(THRESHOLDS, CYCLE_TIMES_US.map(Duration::from_micros), start)
    }

    /// The thresholds, ascending.
    pub(crate) fn thresholds(&self) -> &[usize] {
        &self.thresholds
    }

    /// The cycle times, ascending.
    #[cfg(test)]
    pub(crate) fn cycle_times(&self) -> &[Duration] {
        &self.cycle_times
    }

    /// Whether `candidate` is a point of the grid.
    #[cfg(test)]
    pub(crate) fn contains(&self, candidate: Candidate) -> bool {
        self.thresholds.contains(&candidate.fusion_threshold)
            && self.cycle_times.contains(&candidate.cycle_time)
    }
}

/// How many windows each candidate gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Schedule {
    /// Windows discarded before each scored one (a window's first cycle
    /// still ran with the last candidate; a new threshold's buffers and
    /// plans are being made).
    pub warmup: usize,
    /// Passes over an axis: scored windows per candidate (the start and the
    /// best threshold, measured on both axes, get as many again). A
    /// candidate's score is the median of its windows, each relative to
    /// the start's in the same pass.
    pub samples: usize,
}

impl Default for Schedule {
    /// One warm-up window before each scored one, three passes.
    fn default() -> Self {
        Schedule {
            warmup: 1,
            samples: 3,
        }
    }
}

impl Schedule {
    /// Windows per candidate and pass.
    fn windows(self) -> usize {
        self.warmup + 1
    }

    /// Passes (at least one).
    fn passes(self) -> usize {
        self.samples.max(1)
    }
}

/// What the tuner wants after a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Run the next window with this candidate (perhaps the same).
    Try(Candidate),
    /// The search is over: keep this candidate for good.
    Settled(Candidate),
}

impl Decision {
    /// The candidate to run with.
    pub(crate) fn candidate(self) -> Candidate {
        match self {
            Decision::Try(c) | Decision::Settled(c) => c,
        }
    }
}

/// One candidate's measurements.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Measured {
    /// The setting.
    pub candidate: Candidate,
    /// Its scored windows, as fed.
    pub raw: Vec<f64>,
    /// Each divided by the configured setting's in the same pass.
    pub relative: Vec<f64>,
}

impl Measured {
    /// The median of the raw scores.
    pub(crate) fn raw_median(&self) -> f64 {
        median(&mut self.raw.clone())
    }

    /// The median of the relative scores: what the search compares.
    pub(crate) fn relative_median(&self) -> f64 {
        median(&mut self.relative.clone())
    }
}

/// The coordinate search over a [`Grid`] (see the module doc).
#[derive(Clone, Debug)]
pub(crate) struct Tuner {
    grid: Grid,
    schedule: Schedule,
    start: Candidate,
    /// The candidates of the current axis, the start first.
    axis: Vec<Candidate>,
    /// Whether the current axis is the second (cycle times).
    second_axis: bool,
    /// The pass over the axis, and the candidate's place in it.
    pass: usize,
    at: usize,
    /// Windows run at this place of this pass.
    windows: usize,
    /// The start's score in this pass.
    reference: f64,
    /// Each measured candidate, in the order first measured.
    measured: Vec<Measured>,
    /// Windows observed in all.
    observed: usize,
    settled: Option<Candidate>,
}

impl Tuner {
    /// A search over `grid` starting from (and first measuring) `start`,
    /// which joins the grid if it is not in it.
    pub(crate) fn new(grid: Grid, start: Candidate, schedule: Schedule) -> Tuner {
        let grid = Grid::new(grid.thresholds, grid.cycle_times, start);
        // The first axis: every threshold at the configured cycle time.
        let axis = axis(
            &[start],
            grid.thresholds.iter().map(|&fusion_threshold| Candidate {
                fusion_threshold,
                cycle_time: start.cycle_time,
            }),
        );
        Tuner {
            grid,
            schedule,
            start,
            axis,
            second_axis: false,
            pass: 0,
            at: 0,
            windows: 0,
            reference: 0.0,
            measured: Vec::new(),
            observed: 0,
            settled: None,
        }
    }

    /// The candidate the next window runs with.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Candidate {
        self.settled.unwrap_or(self.axis[self.at])
    }

    /// The grid searched (the start included).
    #[cfg(test)]
    pub(crate) fn grid(&self) -> &Grid {
        &self.grid
    }

    /// The candidate settled on, once the search is over.
    #[cfg(test)]
    pub(crate) fn settled(&self) -> Option<Candidate> {
        self.settled
    }

    /// Each candidate measured so far, in the order first measured (the
    /// start first).
    pub(crate) fn measured(&self) -> &[Measured] {
        &self.measured
    }

    /// Windows observed so far.
    #[cfg(test)]
    pub(crate) fn observed(&self) -> usize {
        self.observed
    }

    /// The most windows before the search is over, whatever the scores:
    /// each pass gives each candidate of an axis [`Schedule`]'s windows;
    /// the second axis (skipped for a single cycle time) holds the start,
    /// the incumbent and the other cycle times.
    pub(crate) fn bound(&self) -> usize {
        let cycle_times = self.grid.cycle_times.len();
        let second = if cycle_times > 1 { cycle_times + 1 } else { 0 };
        (self.grid.thresholds.len() + second) * self.schedule.passes() * self.schedule.windows()
    }

    /// Takes the score of the window just run with the current candidate
    /// (bytes per second; anything not finite and positive counts as 0)
    /// and says what the next window runs with. After the search is over,
    /// every call answers the settled candidate and changes nothing.
    pub(crate) fn observe(&mut self, score: f64) -> Decision {
        if let Some(settled) = self.settled {
            return Decision::Settled(settled);
        }
        self.observed += 1;
        self.windows += 1;
        let current = self.axis[self.at];
        if self.windows < self.schedule.windows() {
            return Decision::Try(current);
        }
        self.windows = 0;
        self.record(current, score);
        self.at += 1;
        if self.at == self.axis.len() {
            self.at = 0;
            self.pass += 1;
        }
        if self.pass == self.schedule.passes() {
            self.pass = 0;
            let best = self.best();
            if self.second_axis || self.grid.cycle_times.len() < 2 {
                self.settled = Some(best);
                return Decision::Settled(best);
            }
            // The second axis: every cycle time at the best threshold,
            // beside the start (the reference) and the incumbent.
            self.second_axis = true;
            self.axis = axis(
                &[self.start, best],
                self.grid.cycle_times.iter().map(|&cycle_time| Candidate {
                    fusion_threshold: best.fusion_threshold,
                    cycle_time,
                }),
            );
        }
        Decision::Try(self.axis[self.at])
    }

    /// Records `current`'s scored window of this pass (the start, first
    /// in every pass, sets the pass's reference).
    fn record(&mut self, current: Candidate, score: f64) {
        let score = if score.is_finite() && score > 0.0 {
            score
        } else {
            0.0
        };
        if current == self.start {
            self.reference = score;
        }
        let relative = match (score, self.reference) {
            (s, r) if r > 0.0 => s / r,
            (s, _) if s > 0.0 => f64::MAX,
            _ => 1.0,
        };
        match self.measured.iter_mut().find(|m| m.candidate == current) {
            Some(m) => {
                m.raw.push(score);
                m.relative.push(relative);
            }
            None => self.measured.push(Measured {
                candidate: current,
                raw: vec![score],
                relative: vec![relative],
            }),
        }
    }

    /// The measured candidate with the highest median relative score; the
    /// earliest measured wins a tie, so the start beats an equal score.
    fn best(&self) -> Candidate {
        let mut best: Option<(Candidate, f64)> = None;
        for m in &self.measured {
            let score = m.relative_median();
            if best.is_none_or(|(_, top)| score > top) {
                best = Some((m.candidate, score));
            }
        }
        best.map_or(self.start, |(c, _)| c)
    }
}

/// An axis: `first` (without repeats), then the other `points` in order.
fn axis(first: &[Candidate], points: impl Iterator<Item = Candidate>) -> Vec<Candidate> {
    let mut axis: Vec<Candidate> = Vec::new();
    for p in first.iter().copied().chain(points) {
        if !axis.contains(&p) {
            axis.push(p);
        }
    }
    axis
}

/// The median of `scores` (the lower of the middle two for an even count;
/// 0 for none). Reorders them.
pub(crate) fn median(scores: &mut [f64]) -> f64 {
    if scores.is_empty() {
        return 0.0;
    }
    scores.sort_unstable_by(f64::total_cmp);
    scores[(scores.len() - 1) / 2]
}
