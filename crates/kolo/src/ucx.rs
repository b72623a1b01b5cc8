//! Running kolo across processes over UCX (the `ucx` feature): one process
//! per rank, started by `kolo-run`, torchrun or any launcher that sets
//! torchrun's variables; no MPI installation needed.

use crate::engine::watchdog::Guards;
use crate::process_set::ucx::UcxSetMaker;
use crate::store_bulletin::StoreBulletin;
use crate::{Config, Error, Kolo};
use kolo_rendezvous::Rendezvous;
use kolo_ucx::UcxComm;
use std::sync::Arc;

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
        let sets = UcxSetMaker::of(&mut rendezvous);
        let interrupter = comm.interrupter();
        let guards = Guards {
            interrupt: Some(Arc::new(move |why: &str| interrupter.interrupt(why))),
            bulletin: Some(StoreBulletin::serving(rendezvous)),
        };
        let kolo = Kolo::start_sharing(comm, config, |_: &mut UcxComm, _: &str| {}, None, guards)?;
        Ok(kolo.making_sets(Arc::new(sets)))
    }
}
