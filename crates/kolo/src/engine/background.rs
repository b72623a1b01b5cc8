//! The background thread of a rank: runs the cycles of its
//! [`Core`](crate::engine::cycle::Core) while no caller does.
//!
//! It sleeps on the command channel: a submission wakes it at once (a busy
//! rank cycles right away), and an idle rank cycles anyway after the cycle
//! time, so that peers' collectives complete and the stall inspector runs.
//! The state it cycles sits behind a lock: on a host engine a caller
//! waiting for its own results may run the cycles instead (see
//! [`crate::engine::progress`]), and the thread then only waits.

use crate::config::Config;
use crate::engine::cycle::Core;
use crate::engine::placement::{NoPlane, PlaneSlot};
use crate::engine::progress::Progress;
use crate::error::Error;
use crate::panic_text::panic_text;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use kolo_transport::Backend;
use parking_lot::Mutex;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the background thread polls for new work, yielding the CPU,
/// before it sleeps on the channel, on a host with fewer cores than kolo
/// has threads there (each rank's caller and its engine): a yield then
/// hands the core to a caller that needs it, and polling longer measured
/// 8% slower on 2 ranks of a 2-core machine.
const SHORT_POLL: Duration = Duration::from_micros(50);

/// [`SHORT_POLL`] on a host where every rank's caller and engine can each
/// have a core: a caller's next step then finds its engine awake, instead
/// of waking a thread asleep on an idle core (15-20 us a step on a 16-core
/// host, measured). Bounded, so an idle engine still goes to sleep.
const LONG_POLL: Duration = Duration::from_micros(500);

/// The poll before sleeping for `local_ranks` ranks on a host of `cores`.
fn poll_budget(local_ranks: usize, cores: usize) -> Duration {
    if local_ranks.saturating_mul(2) <= cores {
        LONG_POLL
    } else {
        SHORT_POLL
    }
}

/// What user threads tell the background thread.
pub(crate) enum Command {
    /// New requests are queued in the tensor table (or a caller that ran
    /// cycles left work behind).
    Wake,
    /// Ask every rank to shut down.
    Shutdown,
    /// Stop at once, as failed, with this message.
    Abort(String),
    /// Free the fusion buffers between two cycles and answer with the
    /// bytes freed (see [`crate::Kolo::release_buffers`]).
    ReleaseBuffers(Sender<usize>),
}

/// The commands one wait collected.
#[derive(Default)]
struct Collected {
    shutdown: bool,
    abort: Option<String>,
    releases: Vec<Sender<usize>>,
}

/// Fails the backend when the rank aborts.
type AbortHook<B> = Box<dyn FnOnce(&mut B, &str) + Send>;

/// A [`Core`] with the background thread's channel: what a caller's
/// thread that runs cycles shares with the background thread.
pub(crate) struct Shareable<B, D> {
    pub(crate) core: Mutex<Core<B, D>>,
    /// Wakes the background thread when a caller leaves work behind.
    pub(crate) wake: Sender<Command>,
}

/// One rank's background thread: waits for work and runs the cycles of
/// its [`Core`] while no caller does.
pub(crate) struct Background<B, D> {
    shared: Arc<Shareable<B, D>>,
    /// The core's cycle time when last seen (the autotuner may change it).
    cycle_time: Duration,
    /// How long to poll for work before sleeping ([`poll_budget`]).
    poll: Duration,
    commands: Receiver<Command>,
    abort: Option<AbortHook<B>>,
}

impl<B: Backend, D: PlaneSlot> Background<B, D> {
    /// The background thread of `core`, woken through `commands` (whose
    /// sender `wake` also goes to callers that run cycles).
    pub(crate) fn new(
        core: Core<B, D>,
        config: &Config,
        commands: Receiver<Command>,
        wake: Sender<Command>,
        abort: impl FnOnce(&mut B, &str) + Send + 'static,
    ) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let poll = poll_budget(core.performer.backend.local_size(), cores);
        Background {
            shared: Arc::new(Shareable {
                core: Mutex::new(core),
                wake,
            }),
            cycle_time: config.cycle_time,
            poll,
            commands,
            abort: Some(Box::new(abort)),
        }
    }

    /// The state this thread shares with callers that run cycles.
    pub(crate) fn shareable(&self) -> &Arc<Shareable<B, D>> {
        &self.shared
    }

    /// Serves until shutdown, abort or failure, then stops the engine
    /// (failing whatever is still pending) with the reason.
    /// (A panic here is caught by the thread's start, in `crate::engine`,
    /// which fails every handle with its message.)
    pub(crate) fn run(mut self) {
        let reason = self.serve();
        self.shared.core.lock().stop(reason);
    }

    /// The cycle loop; returns why it stopped.
    ///
    /// It waits for a command, or for the cycle time, without the lock;
    /// then runs a cycle if the core is free and there is work to do, a
    /// shutdown to agree on, or an idle cycle due. A caller that holds the
    /// core runs the cycles itself, and wakes this thread if it leaves
    /// work behind.
    fn serve(&mut self) -> Error {
        loop {
            let wait = match self.shared.core.try_lock() {
                Some(core) if core.has_work() => Duration::ZERO,
                Some(core) => {
                    self.cycle_time = core.cycle_time;
                    self.cycle_time.saturating_sub(core.last_cycle.elapsed())
                }
                None => self.cycle_time,
            };
            let Collected {
                shutdown,
                abort,
                releases,
            } = self.collect(wait);
            let mut core = if shutdown || abort.is_some() || !releases.is_empty() {
                self.shared.core.lock()
            } else {
                match self.shared.core.try_lock() {
                    Some(core) => core,
                    None => continue,
                }
            };
            if let Some(reason) = &core.stopped {
                return reason.clone();
            }
            if !releases.is_empty() {
                let bytes = core.release_buffers();
                for reply in releases {
                    // A caller that stopped waiting has gone.
                    let _ = reply.send(bytes);
                }
            }
            if let Some(message) = abort {
                if let Some(hook) = self.abort.take() {
                    hook(&mut core.performer.backend, &message);
                }
                return Error::RankFailed {
                    rank: core.performer.rank,
                    message,
                };
            }
            core.shutdown_requested |= shutdown;
            if !(core.has_work() || core.idle_cycle_due()) {
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| core.step())) {
                Ok(Ok(())) => {}
                Ok(Err(reason)) => return reason,
                Err(panic) => {
                    // Every handle learns why, before the thread unwinds.
                    let rank = core.rank();
                    core.stop(Error::RankFailed {
                        rank,
                        message: format!(
                            "kolo's background thread panicked: {}",
                            panic_text(panic.as_ref())
                        ),
                    });
                    drop(core);
                    resume_unwind(panic);
                }
            }
        }
    }

    /// Takes the commands waiting, blocking up to `wait` for the first one
    /// when there are none: whether a shutdown was asked, an abort
    /// message, and the callers asking for the buffers to be freed.
    ///
    /// While this rank has requests the other ranks have not all agreed to
    /// yet, `wait` is zero: its peers' submissions wake *their* engines,
    /// not this one, and a peer whose next cycle waits in the coordinator's
    /// collective for this rank would otherwise wait out this rank's cycle
    /// time (up to 1 ms per step). The next cycle's collective itself waits
    /// for the peers (spinning briefly, then yielding, then sleeping).
    fn collect(&mut self, wait: Duration) -> Collected {
        let mut collected = Collected::default();
        let first = if let Some(command) = self.poll_commands(wait) {
            Some(command)
        } else {
            match self.commands.recv_timeout(wait.saturating_sub(self.poll)) {
                Ok(command) => Some(command),
                Err(RecvTimeoutError::Timeout) => None,
                // `Kolo` is gone without a shutdown request: treat it as one.
                Err(RecvTimeoutError::Disconnected) => {
                    collected.shutdown = true;
                    None
                }
            }
        };
        for command in first.into_iter().chain(self.commands.try_iter()) {
            match command {
                Command::Wake => {}
                Command::Shutdown => collected.shutdown = true,
                Command::Abort(message) => collected.abort = Some(message),
                Command::ReleaseBuffers(reply) => collected.releases.push(reply),
            }
        }
        collected
    }

    /// Polls the channel, yielding the CPU, for up to the poll budget
    /// (at most `wait`): a rank that submits its next tensor right after
    /// the last completed (a training step's next gradient, a latency
    /// loop) then reaches an engine that is still awake, instead of paying
    /// a futex wake-up and a context switch.
    fn poll_commands(&self, wait: Duration) -> Option<Command> {
        let budget = wait.min(self.poll);
        let start = Instant::now();
        loop {
            match self.commands.try_recv() {
                Ok(command) => return Some(command),
                Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
                Err(crossbeam_channel::TryRecvError::Empty) => {}
            }
            if start.elapsed() >= budget {
                return None;
            }
            std::thread::yield_now();
        }
    }
}

/// A caller's thread runs a host engine's cycles (see
/// [`crate::engine::progress`]).
impl<B: Backend + Send + 'static> Progress for Shareable<B, NoPlane> {
    fn run_until(&self, done: &dyn Fn() -> bool, deadline: Instant) -> bool {
        let Some(mut core) = self.core.try_lock() else {
            return false;
        };
        while !core.is_stopped() && !done() && Instant::now() < deadline && core.has_work() {
            match catch_unwind(AssertUnwindSafe(|| core.step())) {
                Ok(Ok(())) => core.count_caller_cycle(),
                Ok(Err(reason)) => core.stop(reason),
                Err(panic) => {
                    let rank = core.rank();
                    core.stop(Error::RankFailed {
                        rank,
                        message: format!(
                            "kolo's engine panicked on a caller's thread: {}",
                            panic_text(panic.as_ref())
                        ),
                    });
                    drop(core);
                    resume_unwind(panic);
                }
            }
        }
        let left = !core.is_stopped() && core.has_work();
        drop(core);
        if left {
            self.wake();
        }
        true
    }

    fn wake(&self) {
        // A closed channel means the background thread has stopped.
        let _ = self.wake.send(Command::Wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_polls_long_only_where_every_thread_has_a_core() {
        // Each rank has two threads on its host: its caller and its engine.
        assert_eq!(poll_budget(1, 2), LONG_POLL);
        assert_eq!(poll_budget(2, 2), SHORT_POLL);
        assert_eq!(poll_budget(2, 16), LONG_POLL);
        assert_eq!(poll_budget(8, 16), LONG_POLL);
        assert_eq!(poll_budget(9, 16), SHORT_POLL);
        assert_eq!(poll_budget(1, 1), SHORT_POLL);
        assert_eq!(poll_budget(usize::MAX, 16), SHORT_POLL);
        assert!(SHORT_POLL < LONG_POLL);
    }
}
