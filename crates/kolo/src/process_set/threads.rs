//! Process sets of thread ranks: the members meet in a registry the
//! ranks of one [`crate::threads::run`] share, and the first to arrive
//! makes the set's kolo-threads world, of which each member takes its
//! communicator.

use crate::config::Config;
use crate::engine::watchdog::{Bulletin, Guards, MemoryBulletin};
use crate::error::Error;
use crate::kolo::{Kolo, SetMaker};
use crate::set_label::SetLabel;
use kolo_threads::ThreadComm;
use kolo_timeline::Timeline;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// A set whose members have not all taken their communicator yet.
struct Meeting {
    /// Each set rank's communicator, until that member takes it.
    comms: Vec<Option<ThreadComm>>,
    /// The set's faults, where each member's watchdog reads the others'.
    bulletin: Arc<dyn Bulletin>,
}

/// The sets being made among the thread ranks of one run.
#[derive(Default)]
pub(crate) struct ThreadSets {
    meetings: Mutex<HashMap<SetLabel, Meeting>>,
}

impl ThreadSets {
    /// Set rank `set_rank`'s communicator of `label`'s world, and the
    /// set's bulletin.
    fn take(
        &self,
        label: &SetLabel,
        set_rank: usize,
    ) -> Result<(ThreadComm, Arc<dyn Bulletin>), Error> {
        let mut meetings = self.meetings.lock();
        if !meetings.contains_key(label) {
            let comms = kolo_threads::communicators(label.members.len()).map_err(|e| {
                Error::ProcessSet {
                    members: label.members.clone(),
                    reason: format!("cannot make its thread ranks: {e}"),
                }
            })?;
            meetings.insert(
                label.clone(),
                Meeting {
                    comms: comms.into_iter().map(Some).collect(),
                    bulletin: Arc::new(MemoryBulletin::default()),
                },
            );
        }
        let meeting = meetings
            .get_mut(label)
            .expect("inserted above when missing");
        let comm = meeting.comms[set_rank]
            .take()
            .ok_or_else(|| Error::ProcessSet {
                members: label.members.clone(),
                reason: format!("set rank {set_rank} was already made (an internal error)"),
            })?;
        let bulletin = Arc::clone(&meeting.bulletin);
        if meeting.comms.iter().all(Option::is_none) {
            meetings.remove(label);
        }
        Ok((comm, bulletin))
    }
}

/// One thread rank's way to make sets.
pub(crate) struct ThreadSetMaker {
    pub(crate) rank: usize,
    pub(crate) sets: Arc<ThreadSets>,
}

impl SetMaker for ThreadSetMaker {
    fn start(&self, label: &SetLabel, config: &Config) -> Result<Kolo, Error> {
        let set_rank = label
            .members
            .iter()
            .position(|&m| m == self.rank)
            .ok_or_else(|| Error::ProcessSet {
                members: label.members.clone(),
                reason: format!("rank {} is not a member", self.rank),
            })?;
        let (comm, bulletin) = self.sets.take(label, set_rank)?;
        let guards = Guards {
            interrupt: None,
            bulletin: Some(bulletin),
        };
        Kolo::start_sharing(
            comm,
            config.clone(),
            |comm: &mut ThreadComm, message: &str| comm.fail(message),
            // The timeline is the world's (rank 0's file): a set writes none.
            Some(Timeline::disabled()),
            guards,
        )
    }
}
