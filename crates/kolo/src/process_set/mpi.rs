//! Process sets of MPI processes: `MPI_Comm_create_group`, called by the
//! members alone on a duplicate of the world kept for it (the world's own
//! communicator belongs to its engine's thread).

use crate::config::Config;
use crate::engine::watchdog::Guards;
use crate::error::Error;
use crate::kolo::{Kolo, SetMaker};
use crate::set_label::SetLabel;
use kolo_mpi::{MpiComm, MAX_GROUP_TAG};
use kolo_timeline::Timeline;
use parking_lot::Mutex;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// One process's way to make sets: a duplicate of the world, made by the
/// world's engine when MPI granted `MPI_THREAD_MULTIPLE` (without it, a
/// set's engine could not call MPI on a thread of its own).
#[derive(Default)]
pub(crate) struct MpiSetMaker {
    spare: Mutex<Option<MpiComm>>,
    /// Why there is no spare, when there is none.
    missing: Mutex<Option<String>>,
}

impl MpiSetMaker {
    /// Keeps `world`'s duplicate for the sets, or why none could be made.
    pub(crate) fn keep(&self, world: &MpiComm) {
        match world.duplicate() {
            Ok(spare) => *self.spare.lock() = Some(spare),
            Err(e) => *self.missing.lock() = Some(e.to_string()),
        }
    }
}

/// The tag of `label`'s creation, the same on every member: sets made at
/// once by different threads of one process differ in it (up to hash
/// collisions, which MPI resolves by the order of the calls).
fn tag(label: &SetLabel) -> u16 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    label.hash(&mut hasher);
    (hasher.finish() % (u64::from(MAX_GROUP_TAG) + 1)) as u16
}

impl SetMaker for MpiSetMaker {
    fn start(&self, label: &SetLabel, config: &Config) -> Result<Kolo, Error> {
        let refuse = |reason: String| Error::ProcessSet {
            members: label.members.clone(),
            reason,
        };
        let comm = {
            let spare = self.spare.lock();
            let Some(spare) = spare.as_ref() else {
                let why = self.missing.lock().clone().unwrap_or_default();
                return Err(refuse(format!(
                    "MPI process sets need MPI_THREAD_MULTIPLE (each set's engine calls MPI \
                     on a thread of its own): {why}"
                )));
            };
            spare
                .create_group(&label.members, tag(label))
                .map_err(|e| refuse(format!("MPI_Comm_create_group failed: {e}")))?
        };
        let comm = Arc::new(Mutex::new(Some(comm)));
        let make = move || {
            comm.lock()
                .take()
                .map(|comm| (comm, None))
                .ok_or_else(|| Error::Start {
                    message: "the set's communicator was taken twice".into(),
                })
        };
        Kolo::start_engine(
            make,
            config.clone(),
            |comm: &mut MpiComm, message: &str| comm.abort(1, message),
            // The timeline is the world's (rank 0's file): a set writes none.
            Some(Timeline::disabled()),
            Guards::default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_the_same_for_a_label_and_within_mpis_bound() {
        let label = SetLabel {
            members: vec![0, 3],
            ordinal: 1,
        };
        assert_eq!(tag(&label), tag(&label.clone()));
        assert!(tag(&label) <= MAX_GROUP_TAG);
    }
}
