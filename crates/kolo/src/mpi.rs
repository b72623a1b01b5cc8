//! Running kolo across processes with MPI (the `mpi` feature): one process
//! per rank, launched with `mpirun -np N program`.

use crate::process_set::mpi::MpiSetMaker;
use crate::{Config, Error, Kolo};
use kolo_mpi::MpiComm;
use std::sync::Arc;

impl Kolo {
    /// Initialises MPI and starts the engine on it: call once per process
    /// of an `mpirun` job. MPI is initialised on the engine's background
    /// thread, which makes every MPI call (so `MPI_THREAD_FUNNELED`, asked
    /// for with `KOLO_MPI_THREADS_DISABLE=1`, is honoured). If this rank
    /// aborts ([`Kolo::abort`]) the whole MPI job is ended with a message
    /// naming the rank, since peers blocked on it would otherwise wait
    /// forever.
    pub fn init_mpi(config: Config) -> Result<Kolo, Error> {
        let disable = config.mpi_threads_disable;
        let sets = Arc::new(MpiSetMaker::default());
        let keeper = Arc::clone(&sets);
        let kolo = Kolo::start_on_thread(
            move || {
                let comm = MpiComm::init(disable).map_err(|e| Error::Start {
                    message: format!("MPI initialisation failed: {e}"),
                })?;
                // Collective, so every rank keeps one (or fails alike).
                keeper.keep(&comm);
                Ok(comm)
            },
            config,
            |comm: &mut MpiComm, message: &str| comm.abort(1, message),
        )?;
        Ok(kolo.making_sets(sets))
    }

    /// Whether MPI granted `MPI_THREAD_MULTIPLE` (`None` when MPI is not
    /// initialised in this process).
    pub fn mpi_threads_supported() -> Option<bool> {
        kolo_mpi::granted_thread_level().map(|level| level == kolo_mpi::ThreadLevel::Multiple)
    }
}
