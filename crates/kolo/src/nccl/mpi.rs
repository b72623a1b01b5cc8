//! One process per GPU under `mpirun` (features `mpi` and `nccl`).

use super::start::with_nccl;
use crate::{Config, Error, Kolo};
use kolo_mpi::MpiComm;
use kolo_nccl::NcclOptions;

impl Kolo {
    /// Initialises MPI and NCCL and starts this process's GPU engine: MPI
    /// negotiates (and serves host tensors), NCCL reduces device tensors on
    /// the GPU of this process's local rank. Call once per process of an
    /// `mpirun` job; both are initialised on the engine's thread, which
    /// makes every MPI and NCCL call. If this rank aborts, the MPI job is
    /// ended (see [`Kolo::init_mpi`]).
    pub fn init_nccl_mpi(config: Config) -> Result<Kolo, Error> {
        Kolo::init_nccl_mpi_with(config, NcclOptions::default())
    }

    /// [`Kolo::init_nccl_mpi`] with the communicator's options.
    pub fn init_nccl_mpi_with(config: Config, options: NcclOptions) -> Result<Kolo, Error> {
        let disable = config.mpi_threads_disable;
        let options = super::start::bounded(options, &config);
        Kolo::start_engine(
            move || {
                let ctrl = MpiComm::init(disable).map_err(|e| Error::Start {
                    message: format!("MPI initialisation failed: {e}"),
                })?;
                with_nccl(ctrl, options)
            },
            config,
            |comm: &mut MpiComm, message: &str| comm.abort(1, message),
            None,
            crate::engine::watchdog::Guards::default(),
        )
    }
}
