//! Running kolo across processes over UCX (the `ucx` feature): one process
//! per rank, started by `kolo-run`, torchrun or any launcher that sets
//! torchrun's variables; no MPI installation needed.

use crate::engine::watchdog::{Bulletin, Guards};
use crate::{Config, Error, Kolo};
use kolo_rendezvous::Rendezvous;
use kolo_ucx::UcxComm;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// The key that counts the faults posted, so that a look at a healthy
/// job's bulletin is one request.
const FAULTS: &str = "kolo/faults";

/// How long a read of the bulletin waits for a key it knows was set.
const READ_BOUND: Duration = Duration::from_millis(200);

impl Kolo {
    /// Joins the job the environment describes (`MASTER_ADDR`,
    /// `MASTER_PORT`, `RANK`, `WORLD_SIZE`, ...; see
    /// `kolo_rendezvous::LaunchVars`), connects to every rank over UCX and
    /// starts the engine on it: call once per process. The connection is
    /// `Send`, so a caller waiting for its results runs the engine's
    /// cycles itself, as on kolo-threads. Rank 0 keeps serving the
    /// rendezvous store while its engine runs: the ranks post their faults
    /// there (see `docs/reliability.md`).
    pub fn init_ucx(config: Config) -> Result<Kolo, Error> {
        config.validate()?;
        let start = |e: &dyn std::fmt::Display| Error::Start {
            message: format!("UCX: {e}"),
        };
        let mut rendezvous = Rendezvous::from_env().map_err(|e| start(&e))?;
        let comm = UcxComm::connect(&mut rendezvous).map_err(|e| start(&e))?;
        let interrupter = comm.interrupter();
        let guards = Guards {
            interrupt: Some(Arc::new(move |why: &str| interrupter.interrupt(why))),
            bulletin: Some(StoreBulletin::serving(rendezvous)),
        };
        Kolo::start_sharing(comm, config, |_: &mut UcxComm, _: &str| {}, None, guards)
    }
}

/// The bulletin of a job that met through kolo-rendezvous: its store.
pub(crate) struct StoreBulletin {
    rendezvous: Mutex<Option<Rendezvous>>,
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
            rendezvous: Mutex::new(None),
        })
    }

    /// Serves the bulletin from `rendezvous`'s store from now on.
    pub(crate) fn fill(&self, rendezvous: Rendezvous) {
        *self.rendezvous.lock() = Some(rendezvous);
    }
}

impl Bulletin for StoreBulletin {
    fn post(&self, rank: usize, fault: &[u8]) {
        let mut guard = self.rendezvous.lock();
        let Some(rendezvous) = guard.as_mut() else {
            return;
        };
        let client = rendezvous.client();
        let posted = client
            .set(&format!("kolo/fault/{rank}"), fault)
            .and_then(|()| client.add(FAULTS, 1));
        if posted.is_err() {
            // A store that cannot be reached (its host gone, a link down)
            // is not asked again: each try could wait for its reply.
            *guard = None;
        }
    }

    fn posted(&self, size: usize) -> Vec<Option<Vec<u8>>> {
        let mut guard = self.rendezvous.lock();
        let Some(rendezvous) = guard.as_mut() else {
            return vec![None; size];
        };
        let client = rendezvous.client();
        match client.add(FAULTS, 0) {
            Ok(count) if count > 0 => {}
            Ok(_) => return vec![None; size],
            Err(_) => {
                *guard = None;
                return vec![None; size];
            }
        }
        (0..size)
            .map(|rank| client.get(&format!("kolo/fault/{rank}"), READ_BOUND).ok())
            .collect()
    }

    fn leave(&self, clean: bool) {
        if let Some(rendezvous) = self.rendezvous.lock().take() {
            // After a fault, some ranks may never leave: rank 0 stops the
            // store at once instead of waiting for them.
            if clean {
                let _ = rendezvous.close();
            }
        }
    }
}
