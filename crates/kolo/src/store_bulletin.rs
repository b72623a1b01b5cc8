//! The watchdog's bulletin of a job that met through kolo-rendezvous
//! (UCX, and NCCL bootstrapped over the store): its store, where each
//! rank posts its fault and reads the others'.

use crate::engine::watchdog::Bulletin;
use kolo_rendezvous::{Client, Rendezvous};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// The prefix of the world's keys on the bulletin: `kolo/faults` counts
/// the faults posted (so that a look at a healthy job's bulletin is one
/// request), `kolo/fault/RANK` holds each.
const WORLD: &str = "kolo";

/// How long a read of the bulletin waits for a key it knows was set.
const READ_BOUND: Duration = Duration::from_millis(200);

/// What a bulletin reaches its store through: the job's rendezvous (whose
/// rank 0 serves the store while it is held), or a client of its own.
enum Store {
    Job(Rendezvous),
    Client(Client),
}

impl Store {
    fn client(&mut self) -> &mut Client {
        match self {
            Store::Job(rendezvous) => rendezvous.client(),
            Store::Client(client) => client,
        }
    }
}

/// The bulletin of a job that met through kolo-rendezvous: its store,
/// under keys of its own prefix (the world's, or a process set's).
pub(crate) struct StoreBulletin {
    store: Mutex<Option<Store>>,
    prefix: String,
}

impl StoreBulletin {
    pub(crate) fn serving(rendezvous: Rendezvous) -> Arc<dyn Bulletin> {
        let bulletin = StoreBulletin::empty();
        bulletin.fill(rendezvous);
        bulletin
    }

    /// A bulletin whose store comes later ([`StoreBulletin::fill`]): an
    /// engine that meets its peers on its own thread.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn empty() -> Arc<StoreBulletin> {
        Arc::new(StoreBulletin {
            store: Mutex::new(None),
            prefix: WORLD.to_owned(),
        })
    }

    /// A process set's bulletin: `client` to the job's store, keys under
    /// `prefix`.
    pub(crate) fn of_set(client: Client, prefix: String) -> Arc<dyn Bulletin> {
        Arc::new(StoreBulletin {
            store: Mutex::new(Some(Store::Client(client))),
            prefix,
        })
    }

    /// Serves the bulletin from `rendezvous`'s store from now on.
    pub(crate) fn fill(&self, rendezvous: Rendezvous) {
        *self.store.lock() = Some(Store::Job(rendezvous));
    }

    fn faults(&self) -> String {
        format!("{}/faults", self.prefix)
    }

    fn fault(&self, rank: usize) -> String {
        format!("{}/fault/{rank}", self.prefix)
    }
}

impl Bulletin for StoreBulletin {
    fn post(&self, rank: usize, fault: &[u8]) {
        let (key, faults) = (self.fault(rank), self.faults());
        let mut guard = self.store.lock();
        let Some(store) = guard.as_mut() else {
            return;
        };
        let client = store.client();
        let posted = client
            .set(&key, fault)
            .and_then(|()| client.add(&faults, 1));
        if posted.is_err() {
            // A store that cannot be reached (its host gone, a link down)
            // is not asked again: each try could wait for its reply.
            *guard = None;
        }
    }

    fn posted(&self, size: usize) -> Vec<Option<Vec<u8>>> {
        let faults = self.faults();
        let mut guard = self.store.lock();
        let Some(store) = guard.as_mut() else {
            return vec![None; size];
        };
        let client = store.client();
        match client.add(&faults, 0) {
            Ok(count) if count > 0 => {}
            Ok(_) => return vec![None; size],
            Err(_) => {
                *guard = None;
                return vec![None; size];
            }
        }
        (0..size)
            .map(|rank| client.get(&self.fault(rank), READ_BOUND).ok())
            .collect()
    }

    fn leave(&self, clean: bool) {
        if let Some(Store::Job(rendezvous)) = self.store.lock().take() {
            // After a fault, some ranks may never leave: rank 0 stops the
            // store at once instead of waiting for them.
            if clean {
                let _ = rendezvous.close();
            }
        }
    }
}
