//! The in-process exchange of thread mode: when every rank of a
//! communicator is a thread of this process, they share a [`Board`] to
//! swap device pointers and event handles for copy-engine operations and
//! to keep their launch queues in step (LLMQ's per-transaction barrier).
//!
//! Rank 0 registers a board under a random id in a process-wide registry
//! and broadcasts the id over the control plane; a rank that finds the id
//! in its own process's registry shares the board. If every rank found it,
//! the communicator is in thread mode. No pointer crosses a process.

use crate::error::NcclError;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct Round {
    /// Completed rounds; waiters watch it change.
    generation: u64,
    arrived: usize,
    inbox: Vec<Option<Vec<u8>>>,
    /// The last round's messages, until every rank has read them.
    result: Option<Arc<Vec<Vec<u8>>>>,
    readers_left: usize,
    /// Set when a rank left or timed out: every later call fails.
    failed: Option<String>,
}

/// An all-gather of byte messages among the threads of one communicator.
#[derive(Debug)]
pub(crate) struct Board {
    size: usize,
    round: Mutex<Round>,
    changed: Condvar,
}

impl Board {
    pub(crate) fn new(size: usize) -> Self {
        Board {
            size,
            round: Mutex::new(Round {
                inbox: vec![None; size],
                ..Round::default()
            }),
            changed: Condvar::new(),
        }
    }

    /// Every rank's `msg`, in rank order. Waits at most `timeout` for the
    /// others; a timeout or a departed rank fails this and every later call.
    pub(crate) fn allgather(
        &self,
        rank: usize,
        msg: Vec<u8>,
        timeout: Duration,
    ) -> Result<Arc<Vec<Vec<u8>>>, NcclError> {
        let deadline = Instant::now() + timeout;
        let mut round = self.round.lock();
        // The previous round's result must be fully read first.
        while round.result.is_some() && round.failed.is_none() {
            self.wait(&mut round, deadline, rank, timeout)?;
        }
        if let Some(why) = &round.failed {
            return Err(NcclError::Broken {
                rank,
                cause: why.clone(),
            });
        }
        if round.inbox[rank].is_some() {
            return Err(NcclError::InvalidArgument(format!(
                "rank {rank} entered a board round twice"
            )));
        }
        round.inbox[rank] = Some(msg);
        round.arrived += 1;
        if round.arrived == self.size {
            let messages = round
                .inbox
                .iter_mut()
                .map(|m| m.take().unwrap_or_default())
                .collect();
            round.result = Some(Arc::new(messages));
            round.readers_left = self.size;
            round.arrived = 0;
            round.generation += 1;
            self.changed.notify_all();
        } else {
            let generation = round.generation;
            while round.generation == generation {
                self.wait(&mut round, deadline, rank, timeout)?;
            }
        }
        let result = round.result.clone().ok_or_else(|| NcclError::Broken {
            rank,
            cause: "board round vanished".into(),
        })?;
        round.readers_left -= 1;
        if round.readers_left == 0 {
            round.result = None;
            self.changed.notify_all();
        }
        Ok(result)
    }

    fn wait(
        &self,
        round: &mut parking_lot::MutexGuard<'_, Round>,
        deadline: Instant,
        rank: usize,
        timeout: Duration,
    ) -> Result<(), NcclError> {
        if let Some(why) = &round.failed {
            return Err(NcclError::Broken {
                rank,
                cause: why.clone(),
            });
        }
        if self.changed.wait_until(round, deadline).timed_out() {
            let why = format!(
                "rank {rank} waited {:.1} s for its peer threads",
                timeout.as_secs_f64()
            );
            round.failed.get_or_insert(why);
            self.changed.notify_all();
            return Err(NcclError::Timeout {
                what: "the peer threads of a copy-engine operation".into(),
                seconds: timeout.as_secs_f64(),
            });
        }
        Ok(())
    }

    /// Rank `rank` is gone (its communicator dropped): waiters fail now.
    pub(crate) fn leave(&self, rank: usize) {
        let mut round = self.round.lock();
        round
            .failed
            .get_or_insert_with(|| format!("rank {rank} left the communicator"));
        self.changed.notify_all();
    }
}

fn registry() -> &'static Mutex<HashMap<u64, Weak<Board>>> {
    static REGISTRY: std::sync::OnceLock<Mutex<HashMap<u64, Weak<Board>>>> =
        std::sync::OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Registers `board` under a fresh random id (and forgets dead boards).
pub(crate) fn register(board: &Arc<Board>) -> u64 {
    let mut map = registry().lock();
    map.retain(|_, b| b.strong_count() > 0);
    loop {
        let id = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        if id != 0 && !map.contains_key(&id) {
            map.insert(id, Arc::downgrade(board));
            return id;
        }
    }
}

/// The board registered under `id` in this process, if any.
pub(crate) fn lookup(id: u64) -> Option<Arc<Board>> {
    registry().lock().get(&id).and_then(Weak::upgrade)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(20);

    #[test]
    fn gathers_in_rank_order_round_after_round() {
        let board = Arc::new(Board::new(3));
        let results: Vec<Vec<Vec<Vec<u8>>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3u8)
                .map(|rank| {
                    let board = board.clone();
                    s.spawn(move || {
                        (0..50u8)
                            .map(|round| {
                                board
                                    .allgather(rank as usize, vec![rank, round], LONG)
                                    .unwrap()
                                    .to_vec()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for per_rank in results {
            for (round, gathered) in per_rank.iter().enumerate() {
                assert_eq!(
                    *gathered,
                    vec![
                        vec![0, round as u8],
                        vec![1, round as u8],
                        vec![2, round as u8]
                    ]
                );
            }
        }
    }

    #[test]
    fn a_missing_rank_times_out_and_fails_later_rounds() {
        let board = Board::new(2);
        let err = board
            .allgather(0, vec![1], Duration::from_millis(20))
            .unwrap_err();
        assert!(matches!(err, NcclError::Timeout { .. }), "{err}");
        let err = board.allgather(1, vec![1], LONG).unwrap_err();
        assert!(matches!(err, NcclError::Broken { .. }), "{err}");
    }

    #[test]
    fn a_departed_rank_wakes_the_waiters() {
        let board = Arc::new(Board::new(2));
        let waiter = {
            let board = board.clone();
            std::thread::spawn(move || board.allgather(0, vec![], LONG))
        };
        std::thread::sleep(Duration::from_millis(10));
        board.leave(1);
        let err = waiter.join().unwrap().unwrap_err();
        assert!(err.to_string().contains("rank 1 left"), "{err}");
    }

    #[test]
    fn registry_finds_live_boards_only() {
        let board = Arc::new(Board::new(1));
        let id = register(&board);
        assert!(lookup(id).is_some());
        drop(board);
        assert!(lookup(id).is_none());
        assert!(lookup(0).is_none());
    }
}
