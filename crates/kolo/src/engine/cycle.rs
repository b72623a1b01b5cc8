//! One rank's engine state and its cycle: the coordinator's negotiation
//! around the backend, and the performer that carries out what the ranks
//! agreed (see [`crate::engine::perform`]). One thread at a time runs a
//! cycle: the background thread ([`crate::engine::background`]) or a
//! caller waiting for its own results ([`crate::engine::progress`]),
//! whichever holds the lock around the [`Core`].

use crate::config::Config;
use crate::engine::autotune::shell::Tuning;
use crate::engine::perform::Performer;
use crate::engine::placement::PlaneSlot;
use crate::engine::shared::{fail_all, Shared};
use crate::error::Error;
use kolo_coordinator::{Agreement, Coordinator, CoordinatorError, Cycle, CycleOutput, Intake};
use kolo_fusion::FusionBuffers;
use kolo_timeline::Timeline;
use kolo_transport::{Backend, TransportError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One rank's engine state: the coordinator and the engine that performs
/// what it agreed. One thread at a time runs its cycles: the background
/// thread, or a caller waiting for its own results (see
/// [`crate::engine::progress`]), whichever holds the lock around it.
pub(crate) struct Core<B, D> {
    pub(super) coordinator: Coordinator,
    pub(super) performer: Performer<B, D>,
    pub(super) shutdown_requested: bool,
    /// Why the engine stopped, once it has (its teardown is done).
    pub(super) stopped: Option<Error>,
    /// When the last cycle started: an idle rank cycles once per cycle
    /// time, whichever thread ran the cycles before.
    pub(super) last_cycle: Instant,
    /// How long an idle rank waits before it cycles anyway: the
    /// configured cycle time, or the autotuner's.
    pub(super) cycle_time: Duration,
    /// The autotuner (idle unless every rank asked for it).
    tuning: Tuning,
    /// Every rank's engine started (see [`agree_start`]),
    /// agreed before the first cycle, by whichever thread runs it.
    agreed: bool,
}

/// The first exchange of every rank's engine, before any cycle: every
/// rank learns whether every other started, so that a rank that cannot
/// start (`failure`: why) fails every rank's engine, named, instead of
/// leaving its peers to wait for it; and whether every rank asked for
/// autotuning (`autotune`), which takes a broadcast that every rank must
/// make. When all started: whether they all tune, or an
/// [`Error::Config`] naming the ranks on each side where they disagree.
///
/// Each rank's message is a byte for its autotune setting, then why it
/// could not start (nothing when it started).
pub(crate) fn agree_start<B: Backend>(
    backend: &mut B,
    failure: Option<&Error>,
    autotune: bool,
) -> Result<bool, Error> {
    let mut mine = vec![u8::from(autotune)];
    if let Some(e) = failure {
        mine.extend(e.to_string().into_bytes());
    }
    let every = backend
        .allgather_bytes(&mine)
        .map_err(Error::from_transport)?;
    if let Some(rank) = every.iter().position(|m| m.len() > 1) {
        return Err(Error::RankFailed {
            rank,
            message: format!(
                "it could not start: {}",
                String::from_utf8_lossy(&every[rank][1..])
            ),
        });
    }
    let (on, off): (Vec<usize>, Vec<usize>) =
        (0..every.len()).partition(|&r| every[r].first() == Some(&1));
    if !on.is_empty() && !off.is_empty() {
        return Err(Error::Config {
            variable: crate::config::AUTOTUNE.into(),
            value: format!("on at ranks {on:?}, off at ranks {off:?}"),
            reason: "every rank must use the same value: the tuned settings \
                     reach every rank in a broadcast each rank makes"
                .into(),
        });
    }
    Ok(off.is_empty())
}

impl<B: Backend, D: PlaneSlot> Core<B, D> {
    /// A rank's engine state on `backend`, with the device plane `device`.
    pub(crate) fn new(
        backend: B,
        config: &Config,
        timeline: Timeline,
        shared: Arc<Shared>,
        device: D,
    ) -> Self {
        let (rank, size) = (backend.rank(), backend.size());
        let tuning = Tuning::new(rank, config);
        *shared.autotune.lock() = Some(tuning.snapshot());
        let mut performer =
            Performer::new(backend, config.fusion_threshold, timeline, shared, device);
        if config.autotune {
            // Room for the largest threshold the tuner may try, as for a
            // configured one.
            let largest = Tuning::largest_threshold(config);
            performer.buffers = FusionBuffers::with_budget(largest.saturating_mul(2));
        }
        Core {
            coordinator: Coordinator::new(rank, size, config.coordinator()),
            performer,
            shutdown_requested: false,
            stopped: None,
            last_cycle: Instant::now(),
            cycle_time: config.cycle_time,
            tuning,
            agreed: false,
        }
    }

    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.performer.rank
    }

    /// Frees the fusion buffers of the host and the device plane (see
    /// [`crate::Kolo::release_buffers`]); returns the bytes freed. Between
    /// cycles no operation holds one, so none is in use.
    pub(crate) fn release_buffers(&mut self) -> usize {
        let host = self.performer.buffers.release();
        self.performer.shared.stats.lock().fusion_buffer_bytes = 0;
        let device = self
            .performer
            .device
            .plane()
            .map_or(0, |plane| plane.release_buffers());
        host + device
    }

    /// True once the engine stopped.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// True while a cycle has something to do: a shutdown to agree on,
    /// submissions queued in the table, or requests the ranks have not all
    /// agreed to yet.
    pub(crate) fn has_work(&self) -> bool {
        self.shutdown_requested
            || self.coordinator.pending() > 0
            || self.performer.shared.table.lock().has_queued()
    }

    /// True once an idle rank is due to cycle (see [`Core::last_cycle`]).
    pub(super) fn idle_cycle_due(&self) -> bool {
        self.last_cycle.elapsed() >= self.cycle_time
    }

    /// Runs one cycle: takes the queued submissions, negotiates, and
    /// performs what the ranks agreed. `Err` says why the engine stops
    /// (shut down, or failed); stopping is then up to the caller
    /// ([`Core::stop`]).
    pub(crate) fn step(&mut self) -> Result<(), Error> {
        if !self.agreed {
            let tune = agree_start(&mut self.performer.backend, None, self.tuning.wanted())?;
            self.tuning.begin(tune, Instant::now());
            self.agreed = true;
        }
        let started = Instant::now();
        self.last_cycle = started;
        let requests = self.take_queued()?;
        let busy = !requests.is_empty();
        let cycle = match self.coordinator.cycle_deferring(
            &mut self.performer.backend,
            requests,
            self.shutdown_requested,
            Instant::now(),
        ) {
            Ok(cycle) => cycle,
            Err(CoordinatorError::Transport(e)) => return Err(Error::from_transport(e)),
            Err(e @ CoordinatorError::CacheCapacityMismatch { capacity, .. }) => {
                return Err(Error::Config {
                    variable: "KOLO_CACHE_CAPACITY".into(),
                    value: capacity.to_string(),
                    reason: e.to_string(),
                })
            }
            Err(other) => {
                return Err(Error::Transport(kolo_transport::TransportError::Backend(
                    other.to_string(),
                )))
            }
        };
        let output = match cycle {
            Cycle::Done(output) => self.perform_cycle(output, busy),
            Cycle::Hits(agreement) => self.repeat_or_perform(agreement, busy),
        };
        if output.shutdown {
            return Err(Error::ShutDown {
                by_ranks: output.shutdown_ranks,
            });
        }
        if self.tuning.running() {
            self.tune(&output, started)?;
        }
        self.performer.buffers.tick();
        Ok(())
    }

    /// Feeds the cycle that started at `started` to the autotuner, and
    /// applies the setting it hands out at a window's end (the same on
    /// every rank, from the next cycle on).
    fn tune(&mut self, output: &CycleOutput, started: Instant) -> Result<(), Error> {
        let cache = self.coordinator.cache();
        let work = output.responses.iter().map(|a| &*a.response).chain(
            output
                .hits
                .iter()
                .filter_map(|h| cache.response(h.slot).map(|r| &**r)),
        );
        let backend = &mut self.performer.backend;
        let Some(setting) = self.tuning.after_cycle(backend, work, started)? else {
            return Ok(());
        };
        self.performer
            .set_fusion_threshold(setting.fusion_threshold);
        self.cycle_time = setting.cycle_time;
        *self.performer.shared.autotune.lock() = Some(self.tuning.snapshot());
        Ok(())
    }

    /// Counts a cycle that a caller's thread ran.
    pub(crate) fn count_caller_cycle(&self) {
        self.performer.shared.stats.lock().caller_cycles += 1;
    }

    /// Stops the engine for `reason`: closes the table (nothing new
    /// reaches the engine after it), fails every pending handle with the
    /// reason and flushes the timeline. Idempotent.
    pub(crate) fn stop(&mut self, reason: Error) {
        if self.stopped.is_some() {
            return;
        }
        let rank = self.performer.rank;
        tracing::debug!(rank, %reason, "kolo engine stopped");
        // Where this rank stood, before its handles fail: the desync
        // report's (see `crate::engine::watchdog`), and in the error when
        // a peer was lost.
        let standing = self
            .performer
            .shared
            .table
            .lock()
            .standing(rank, Instant::now());
        let reason = match reason {
            Error::RankFailed {
                rank: lost,
                message,
            } if lost != rank => Error::RankFailed {
                rank: lost,
                message: format!("{message} ({})", standing.line()),
            },
            other => other,
        };
        self.performer
            .shared
            .final_standing
            .lock()
            .get_or_insert(standing);
        fail_all(&self.performer.shared, reason.clone());
        self.performer.held.clear();
        self.performer.batches.fail_all(&reason);
        if let Err(e) = self.performer.timeline.flush() {
            tracing::warn!(rank, error = %e, "the timeline could not be written");
        }
        self.stopped = Some(reason);
    }

    /// Ends a cycle of cache hits only. A step that repeats the last one
    /// performed whole ([`Performer::perform_repeat`]) completes before the
    /// coordinator settles its books: the user's next step starts while
    /// this thread finishes the cycle. Otherwise the cycle ends first and
    /// its hits are performed as any cycle's.
    fn repeat_or_perform(&mut self, agreement: Agreement, busy: bool) -> CycleOutput {
        match self
            .performer
            .perform_repeat(&self.coordinator, agreement.slots())
        {
            Some(ids) => {
                let output = self.coordinator.finish_cycle(agreement);
                self.performer.repeated(&self.coordinator, &ids);
                output
            }
            None => {
                let output = self.coordinator.finish_cycle(agreement);
                self.perform_cycle(output, busy)
            }
        }
    }

    /// Counts a whole cycle and performs its responses and hits.
    fn perform_cycle(&mut self, output: CycleOutput, busy: bool) -> CycleOutput {
        self.performer.record_cycle(&output, busy);
        self.performer
            .perform_all(&self.coordinator, &output.responses, &output.hits);
        output
    }

    /// Takes the submissions queued in the tensor table: registers their
    /// new names with the coordinator, holds them, and returns their
    /// requests; ids no longer used are reclaimed.
    fn take_queued(&mut self) -> Result<Intake, Error> {
        let shared = Arc::clone(&self.performer.shared);
        let mut table = shared.table.lock();
        let taken = table.take_queued();
        for (id, name) in &taken.named {
            self.coordinator.register(*id, name).map_err(|e| {
                Error::Transport(TransportError::Backend(format!(
                    "internal: the tensor table's ids disagree with the coordinator's: {e}"
                )))
            })?;
        }
        let requests = self.performer.hold(taken);
        let (held, coordinator) = (&self.performer.held, &mut self.coordinator);
        table.reclaim(|id| {
            held.get(id.index()).is_none_or(Option::is_none) && coordinator.forget(id)
        });
        Ok(requests)
    }
}
