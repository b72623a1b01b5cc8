//! The search: which (fusion threshold, cycle time) to try next, given the
//! scores of the windows measured so far. Pure: it is fed one score per
//! window and never reads a clock.
//!
//! # Why a coordinate search over a small grid
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
//!   score one pass per axis finds the grid's best (tested);
//! - it costs `thresholds + cycle_times - 1` candidates rather than their
//!   product, and the number of windows before it settles is known in
//!   advance ([`Tuner::bound`]), which a Gaussian process's stopping rule
//!   is not;
//! - a median of a few windows shrugs off the odd slow window (a page
//!   fault, a descheduled thread) that a single sample, or a model fitted
//!   to every sample, would chase;
//! - the configured setting is measured first and wins ties, so the
//!   setting it settles on scored at least as well as the configured one.

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
const CYCLE_TIMES_US: [u64; 3] = [250, 2_500, 10_000];

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
    /// 16 and 64 MiB, cycle times of 0.25, 2.5 and 10 ms, and `start`'s.
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
    /// Windows discarded after a change (the first cycle of a window still
    /// ran with the last candidate; a new threshold's buffers and plans are
    /// being made).
    pub warmup: usize,
    /// Windows scored; the candidate's score is their median.
    pub samples: usize,
}

impl Default for Schedule {
    /// One warm-up window and the median of three.
    fn default() -> Self {
        Schedule {
            warmup: 1,
            samples: 3,
        }
    }
}

impl Schedule {
    /// Windows per candidate (at least one scored).
    fn windows(self) -> usize {
        self.warmup + self.samples.max(1)
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

/// The coordinate search over a [`Grid`] (see the module doc).
#[derive(Clone, Debug)]
pub(crate) struct Tuner {
    grid: Grid,
    schedule: Schedule,
    start: Candidate,
    /// Candidates still to measure on the current axis, next last.
    queue: Vec<Candidate>,
    /// Whether the cycle-time axis has been queued.
    second_axis: bool,
    current: Candidate,
    /// Windows the current candidate has run.
    windows: usize,
    /// Its scored windows.
    window_scores: Vec<f64>,
    /// Each measured candidate with its median score, in the order
    /// measured.
    scores: Vec<(Candidate, f64)>,
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
        let mut queue: Vec<Candidate> = grid
            .thresholds
            .iter()
            .filter(|&&t| t != start.fusion_threshold)
            .map(|&fusion_threshold| Candidate {
                fusion_threshold,
                cycle_time: start.cycle_time,
            })
            .collect();
        queue.reverse();
        Tuner {
            grid,
            schedule,
            start,
            queue,
            second_axis: false,
            current: start,
            windows: 0,
            window_scores: Vec::new(),
            scores: Vec::new(),
            observed: 0,
            settled: None,
        }
    }

    /// The candidate the next window runs with.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Candidate {
        self.settled.unwrap_or(self.current)
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

    /// The median score of each candidate measured, in the order measured
    /// (the start first).
    pub(crate) fn scores(&self) -> &[(Candidate, f64)] {
        &self.scores
    }

    /// Windows observed so far.
    #[cfg(test)]
    pub(crate) fn observed(&self) -> usize {
        self.observed
    }

    /// The windows after which the search is over, whatever the scores:
    /// each candidate of the two axes (the start once) gets
    /// [`Schedule`]'s windows.
    pub(crate) fn bound(&self) -> usize {
        let candidates = self.grid.thresholds.len() + self.grid.cycle_times.len() - 1;
        candidates * self.schedule.windows()
    }

    /// Takes the score of the window just run with [`Tuner::current`]
    /// (bytes per second; anything not finite and positive counts as 0)
    /// and says what the next window runs with. After the search is over,
    /// every call answers the settled candidate and changes nothing.
    pub(crate) fn observe(&mut self, score: f64) -> Decision {
        if let Some(settled) = self.settled {
            return Decision::Settled(settled);
        }
        self.observed += 1;
        self.windows += 1;
        if self.windows > self.schedule.warmup {
            let score = if score.is_finite() && score > 0.0 {
                score
            } else {
                0.0
            };
            self.window_scores.push(score);
        }
        if self.windows < self.schedule.windows() {
            return Decision::Try(self.current);
        }
        let median = median(&mut self.window_scores);
        self.scores.push((self.current, median));
        self.windows = 0;
        self.window_scores.clear();
        if self.queue.is_empty() && !self.second_axis {
            self.second_axis = true;
            let best = self.best();
            self.queue = self
                .grid
                .cycle_times
                .iter()
                .filter(|&&c| c != best.cycle_time)
                .map(|&cycle_time| Candidate {
                    fusion_threshold: best.fusion_threshold,
                    cycle_time,
                })
                .rev()
                .collect();
        }
        match self.queue.pop() {
            Some(next) => {
                self.current = next;
                Decision::Try(next)
            }
            None => {
                let best = self.best();
                self.settled = Some(best);
                Decision::Settled(best)
            }
        }
    }

    /// The measured candidate with the highest median; the earliest
    /// measured wins a tie, so the start beats an equal score.
    fn best(&self) -> Candidate {
        let mut best: Option<(Candidate, f64)> = None;
        for &(candidate, score) in &self.scores {
            if best.is_none_or(|(_, top)| score > top) {
                best = Some((candidate, score));
            }
        }
        best.map_or(self.start, |(c, _)| c)
    }
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
