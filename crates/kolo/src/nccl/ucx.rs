//! One process per GPU without MPI (features `nccl` and `ucx`): the
//! processes meet through kolo-rendezvous, under `kolo-run`, torchrun or
//! any launcher that sets torchrun's variables.

use super::plane::NcclPlane;
use crate::engine::placement::DevicePlane;
use crate::engine::watchdog::Guards;
use crate::store_bulletin::StoreBulletin;
use crate::{Config, Error, Kolo};
use kolo_nccl::{NcclComm, NcclOptions};
use kolo_rendezvous::Rendezvous;
use kolo_ucx::UcxComm;
use std::sync::Arc;

impl Kolo {
    /// Joins the job the environment describes (`MASTER_ADDR`,
    /// `MASTER_PORT`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, ...; see
    /// `kolo_rendezvous::LaunchVars`) and starts this process's GPU engine:
    /// UCX negotiates (and serves host tensors), NCCL reduces device
    /// tensors on the GPU of this process's local rank. NCCL's bootstrap
    /// (every rank's device, the unique id, each step's outcome) goes
    /// through the rendezvous store, UCX's worker addresses too; no MPI is
    /// needed. Call once per process.
    pub fn init_nccl_ucx(config: Config) -> Result<Kolo, Error> {
        Kolo::init_nccl_ucx_with(config, NcclOptions::default())
    }

    /// [`Kolo::init_nccl_ucx`] with the communicator's options.
    pub fn init_nccl_ucx_with(config: Config, options: NcclOptions) -> Result<Kolo, Error> {
        config.validate()?;
        let options = super::start::bounded(options, &config);
        // The store stays up while the engine runs: the ranks post their
        // faults there (see `docs/reliability.md`).
        let bulletin = StoreBulletin::empty();
        let store = Arc::clone(&bulletin);
        let guards = Guards {
            interrupt: None,
            bulletin: Some(bulletin),
        };
        Kolo::start_engine(
            move || {
                let start = |what: &str, e: &dyn std::fmt::Display| Error::Start {
                    message: format!("{what}: {e}"),
                };
                let mut rendezvous = Rendezvous::from_env().map_err(|e| start("rendezvous", &e))?;
                let ucx = UcxComm::connect(&mut rendezvous).map_err(|e| start("UCX", &e))?;
                let nccl = NcclComm::init(&mut rendezvous, options).map_err(|e| Error::Start {
                    message: format!("cannot start NCCL on rank {}: {e}", rendezvous.rank()),
                })?;
                store.fill(rendezvous);
                let plane: Box<dyn DevicePlane> = Box::new(NcclPlane::new(nccl));
                Ok((ucx, Some(plane)))
            },
            config,
            |_: &mut UcxComm, _: &str| {},
            None,
            guards,
        )
    }
}
