//! The watchdog: one thread per engine that bounds how long an operation
//! may take ([`crate::Config::timeout`]) and spreads a fault to every rank
//! it can reach.
//!
//! Negotiation needs no watchdog: a tensor that some ranks did not submit
//! fails on every rank alike when rank 0's stall inspector shuts it down
//! at the timeout. The watchdog is for what the engine's own thread cannot
//! see because it is the one stuck: a collective or a negotiation blocked
//! in the backend on a peer that stopped answering (a frozen process, a
//! link down, a GPU that hangs). It waits a grace period past the timeout
//! so that the inspector's shutdown comes first where it can, then:
//!
//! 1. takes this rank's [`Standing`] (last completed and pending
//!    submissions) and fails every pending handle with
//!    [`Error::Timeout`] naming its tensor, keeping the leases on lent
//!    memory until the engine lets go of it;
//! 2. posts the fault on the job's [`Bulletin`] (where the backend has
//!    one: the thread ranks' shared memory, the UCX job's rendezvous
//!    store), so that every other rank's watchdog stops its engine with
//!    the same cause, and puts the desync [`paragraph`] over every
//!    standing posted within a moment in its error (rank 0 logs it);
//! 3. interrupts the backend's waits and aborts the engine, whose thread
//!    then stops (its abort hook fails the backend for the peers).
//!
//! When the engine stops for a failure of its own (a peer lost), the
//! watchdog posts this rank's standing too, and rank 0 writes the
//! paragraph.

use crate::engine::background::Command;
use crate::engine::desync::{paragraph, Fault, Standing};
use crate::engine::shared::Shared;
use crate::error::Error;
use crossbeam_channel::{RecvTimeoutError, Sender};
use parking_lot::Mutex;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the ranks of a job post their faults, readable by every rank
/// while some of them cannot talk over the backend any more.
pub(crate) trait Bulletin: Send + Sync {
    /// Posts rank `rank`'s fault (best effort: a store that is gone takes
    /// nothing).
    fn post(&self, rank: usize, fault: &[u8]);
    /// What each of ranks `0..size` posted so far (best effort).
    fn posted(&self, size: usize) -> Vec<Option<Vec<u8>>>;
    /// This rank is done with the bulletin: `clean` after a shutdown every
    /// rank agreed on.
    fn leave(&self, _clean: bool) {}
}

/// The bulletin of thread ranks: memory they share.
#[derive(Default)]
pub(crate) struct MemoryBulletin {
    posts: Mutex<Vec<Option<Vec<u8>>>>,
}

impl Bulletin for MemoryBulletin {
    fn post(&self, rank: usize, fault: &[u8]) {
        let mut posts = self.posts.lock();
        if posts.len() <= rank {
            posts.resize(rank + 1, None);
        }
        posts[rank] = Some(fault.to_vec());
    }

    fn posted(&self, size: usize) -> Vec<Option<Vec<u8>>> {
        let posts = self.posts.lock();
        (0..size)
            .map(|rank| posts.get(rank).cloned().flatten())
            .collect()
    }
}

/// Ends the backend's blocked waits from another thread.
pub(crate) type Interrupt = Arc<dyn Fn(&str) + Send + Sync>;

/// What a backend gives the watchdog beyond the engine's own channel.
#[derive(Default)]
pub(crate) struct Guards {
    /// Ends the backend's waits (UCX: its interrupter).
    pub interrupt: Option<Interrupt>,
    /// Where the job's ranks post faults.
    pub bulletin: Option<Arc<dyn Bulletin>>,
}

/// The settings and handles a watchdog runs with.
pub(crate) struct Watch {
    pub rank: usize,
    pub size: usize,
    pub timeout: Option<Duration>,
    pub shared: Arc<Shared>,
    pub commands: Sender<Command>,
    pub guards: Guards,
}

/// A running watchdog; dropping it stops the thread.
pub(crate) struct Watchdog {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    bulletin: Option<Arc<dyn Bulletin>>,
    interrupt: Option<Interrupt>,
}

/// The grace past the timeout before the watchdog acts: the stall
/// inspector's shutdown, which fails a tensor on every rank alike, comes
/// first where negotiation still works.
pub(crate) fn grace(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(200), Duration::from_secs(10))
}

/// How often the watchdog looks: a fraction of the timeout, at most a
/// quarter second (it also reads the bulletin this often).
fn tick(timeout: Option<Duration>) -> Duration {
    let quarter = Duration::from_millis(250);
    timeout.map_or(quarter, |t| {
        (t / 8).clamp(Duration::from_millis(10), quarter)
    })
}

/// How long rank 0 waits for the other ranks' standings before it writes
/// the desync paragraph.
fn gather_window(timeout: Option<Duration>) -> Duration {
    Duration::from_secs(2) + 2 * tick(timeout)
}

impl Watchdog {
    /// Starts the watchdog of an engine (none without a timeout nor a
    /// bulletin: nothing to watch).
    pub(crate) fn start(watch: Watch) -> Option<Watchdog> {
        if watch.timeout.is_none() && watch.guards.bulletin.is_none() {
            return None;
        }
        let bulletin = watch.guards.bulletin.clone();
        let interrupt = watch.guards.interrupt.clone();
        let (stop, stopped) = crossbeam_channel::bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("kolo-watchdog".into())
            .spawn(move || {
                let tick = tick(watch.timeout);
                loop {
                    match stopped.recv_timeout(tick) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    if !watch.look() {
                        return;
                    }
                }
            });
        match thread {
            Ok(thread) => Some(Watchdog {
                stop: Some(stop),
                thread: Some(thread),
                bulletin,
                interrupt,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "kolo's watchdog could not start: operations are not bounded in time");
                None
            }
        }
    }

    /// Ends the backend's blocked waits (a teardown that outlived its
    /// bound).
    pub(crate) fn interrupt(&self, why: &str) {
        if let Some(interrupt) = &self.interrupt {
            interrupt(why);
        }
    }

    /// Stops the watchdog and leaves the bulletin (`clean`: after an
    /// agreed shutdown).
    pub(crate) fn stop(&mut self, clean: bool) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(bulletin) = self.bulletin.take() {
            bulletin.leave(clean);
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop(false);
    }
}

/// What made the watchdog act.
enum Cause {
    /// This rank's oldest pending operation outlived the timeout.
    Timeout(Duration),
    /// Another rank posted a fault first.
    Peer(Fault),
}

impl Watch {
    /// One look; false once the watchdog is done.
    fn look(&self) -> bool {
        let now = Instant::now();
        let (closed, oldest) = {
            let table = self.shared.table.lock();
            (table.closed().cloned(), table.oldest_pending())
        };
        if let Some(reason) = closed {
            // The engine stopped. For a failure, say where this rank
            // stood (rank 0: where every rank stood).
            if !matches!(reason, Error::ShutDown { .. }) {
                let standing = self
                    .shared
                    .final_standing
                    .lock()
                    .clone()
                    .unwrap_or_else(|| Standing {
                        rank: self.rank,
                        ..Standing::default()
                    });
                let origin = match &reason {
                    Error::RankFailed { rank, .. } => *rank,
                    _ => self.rank,
                };
                let _ = self.publish(&reason.to_string(), origin, None, standing);
            }
            return false;
        }
        if let (Some(timeout), Some(oldest)) = (self.timeout, oldest) {
            if now.saturating_duration_since(oldest) >= timeout + grace(timeout) {
                self.act(Cause::Timeout(timeout));
                return false;
            }
        }
        if let Some(fault) = self.peer_fault() {
            self.act(Cause::Peer(fault));
            return false;
        }
        true
    }

    /// The fault another rank posted (the one that started first, by
    /// origin rank), if any.
    fn peer_fault(&self) -> Option<Fault> {
        let bulletin = self.guards.bulletin.as_ref()?;
        bulletin
            .posted(self.size)
            .into_iter()
            .enumerate()
            .filter(|(rank, _)| *rank != self.rank)
            .filter_map(|(_, bytes)| Fault::decode(&bytes?))
            .min_by_key(|fault| fault.origin)
    }

    /// Fails every pending handle for `cause`, tells the other ranks and
    /// stops the engine.
    fn act(&self, cause: Cause) {
        let now = Instant::now();
        let mut table = self.shared.table.lock();
        let standing = table.standing(self.rank, now);
        let error = match &cause {
            Cause::Timeout(after) => Error::Timeout {
                tensor: standing
                    .first_pending()
                    .map(|op| op.tensor.clone())
                    .unwrap_or_default(),
                after: *after,
                report: standing.line(),
            },
            // The origin's cause, as this rank's: a timeout there is one
            // here (every pending tensor of this rank fails with it).
            Cause::Peer(fault) => match fault.after {
                Some(after) => Error::Timeout {
                    tensor: standing
                        .first_pending()
                        .map(|op| op.tensor.clone())
                        .unwrap_or_default(),
                    after,
                    report: format!(
                        "{}; rank {} timed out first: {}",
                        standing.line(),
                        fault.origin,
                        fault.cause
                    ),
                },
                None => Error::RankFailed {
                    rank: fault.origin,
                    message: fault.cause.clone(),
                },
            },
        };
        let after = match &cause {
            Cause::Timeout(after) => Some(*after),
            Cause::Peer(fault) => fault.after,
        };
        let origin = match &cause {
            Cause::Timeout(_) => self.rank,
            Cause::Peer(fault) => fault.origin,
        };
        let cause_text = match &cause {
            Cause::Timeout(_) => error.to_string(),
            Cause::Peer(fault) => fault.cause.clone(),
        };
        // Nothing new is accepted; what is in flight is failed below.
        drop(table.close(error.clone()));
        let live = table.take_live();
        drop(table);
        *self.shared.final_standing.lock() = Some(standing.clone());
        let error = match self.publish(&cause_text, origin, after, standing) {
            Some(paragraph) => with_paragraph(error, &paragraph),
            None => error,
        };
        tracing::error!(rank = self.rank, %error, "kolo stops");
        for completion in live {
            completion.abandon(|tensor| match &error {
                Error::Timeout { after, report, .. } => Error::Timeout {
                    tensor: tensor.to_owned(),
                    after: *after,
                    report: report.clone(),
                },
                other => other.clone(),
            });
        }
        let message = error.to_string();
        if let Some(interrupt) = &self.guards.interrupt {
            interrupt(&message);
        }
        let _ = self.commands.send(Command::Abort(message));
    }

    /// Logs where this rank stands and posts its fault (`cause`, first
    /// raised by rank `origin`); returns the desync paragraph over every
    /// standing posted within the gather window (which rank 0 logs), where
    /// the job has a bulletin.
    fn publish(
        &self,
        cause: &str,
        origin: usize,
        after: Option<Duration>,
        standing: Standing,
    ) -> Option<String> {
        tracing::error!(rank = self.rank, standing = %standing.line(), "kolo: where this rank stands");
        let Some(bulletin) = &self.guards.bulletin else {
            return None;
        };
        let fault = Fault {
            origin,
            after,
            cause: cause.to_owned(),
            standing,
        };
        bulletin.post(self.rank, &fault.encode());
        // Every rank waits a moment for the others' standings, so that its
        // error names the ranks behind; rank 0 logs the paragraph.
        let deadline = Instant::now() + gather_window(self.timeout);
        let standings = loop {
            let mut standings: Vec<Option<Standing>> = bulletin
                .posted(self.size)
                .into_iter()
                .map(|bytes| Fault::decode(&bytes?).map(|f| f.standing))
                .collect();
            // Its own, also where the store cannot be reached.
            standings[self.rank] = Some(fault.standing.clone());
            if standings.iter().all(Option::is_some) || Instant::now() >= deadline {
                break standings;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let text = paragraph(&standings);
        if self.rank == 0 {
            tracing::error!(rank = 0, "kolo {text}");
        }
        Some(text)
    }
}

/// `error` with rank 0's desync paragraph added to its report.
fn with_paragraph(error: Error, paragraph: &str) -> Error {
    match error {
        Error::Timeout {
            tensor,
            after,
            report,
        } => Error::Timeout {
            tensor,
            after,
            report: format!("{report}. {paragraph}"),
        },
        Error::RankFailed { rank, message } => Error::RankFailed {
            rank,
            message: format!("{message}. {paragraph}"),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_and_tick_stay_within_their_bounds() {
        assert_eq!(grace(Duration::from_secs(300)), Duration::from_secs(10));
        assert_eq!(grace(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(
            grace(Duration::from_millis(100)),
            Duration::from_millis(200)
        );
        assert_eq!(tick(None), Duration::from_millis(250));
        assert_eq!(
            tick(Some(Duration::from_secs(1))),
            Duration::from_millis(125)
        );
        assert_eq!(
            tick(Some(Duration::from_millis(1))),
            Duration::from_millis(10)
        );
    }

    #[test]
    fn a_memory_bulletin_keeps_each_ranks_last_post() {
        let board = MemoryBulletin::default();
        assert_eq!(board.posted(2), vec![None, None]);
        board.post(1, b"one");
        board.post(1, b"two");
        assert_eq!(board.posted(3), vec![None, Some(b"two".to_vec()), None]);
    }
}
