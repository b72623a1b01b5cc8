//! Running kolo across processes over UCX (the `ucx` feature): one process
//! per rank, started by `kolo-run`, torchrun or any launcher that sets
//! torchrun's variables; no MPI installation needed.

use crate::{Config, Error, Kolo};
use kolo_ucx::UcxComm;

impl Kolo {
    /// Joins the job the environment describes (`MASTER_ADDR`,
    /// `MASTER_PORT`, `RANK`, `WORLD_SIZE`, ...; see
    /// `kolo_rendezvous::LaunchVars`), connects to every rank over UCX and
    /// starts the engine on it: call once per process. The connection is
    /// `Send`, so a caller waiting for its results runs the engine's
    /// cycles itself, as on kolo-threads.
    pub fn init_ucx(config: Config) -> Result<Kolo, Error> {
        config.validate()?;
        let comm = UcxComm::from_env().map_err(|e| Error::Start {
            message: format!("UCX: {e}"),
        })?;
        Kolo::start(comm, config)
    }
}
