//! How to build an [`NcclComm`](crate::NcclComm): the device, copy
//! engines, the timeouts, and process or thread mode.

use std::time::Duration;

/// Whether thread-mode all-gathers and sends / receives of transactions
/// run as device-to-device copies on the copy engines instead of NCCL
/// kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyEngine {
    /// Everything through NCCL.
    #[default]
    Off,
    /// Copy engines for all-gather and transaction send / recv (thread
    /// mode only; an error in process mode).
    On,
}

/// How the ranks of a communicator are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One process per GPU (e.g. under `mpirun`).
    ProcessPerGpu,
    /// One thread per GPU, all in this process.
    ThreadPerGpu,
}

/// How to build an [`NcclComm`](crate::NcclComm).
#[derive(Clone, Debug)]
pub struct NcclOptions {
    /// The CUDA device; `None` picks the controller's local rank.
    pub device: Option<usize>,
    /// Copy engines for thread mode.
    pub copy_engine: CopyEngine,
    /// An operation still pending after this long fails, with every other
    /// pending operation, and breaks the communicator (a dead peer must not
    /// hang the job).
    pub op_timeout: Duration,
    /// The bound on draining and finalizing at shutdown.
    pub teardown_timeout: Duration,
    /// Process or thread mode; `None` detects it: thread mode when every
    /// rank is a thread of this process and there are two or more ranks
    /// (or copy engines are requested), process mode otherwise — so one
    /// MPI process alone is in process mode. [`crate::threads::run`] asks
    /// for thread mode.
    pub mode: Option<Mode>,
    /// Whether allreduces may run kolo-nccl's peer kernels (see
    /// [`crate::crossover`]) where they beat NCCL; `false` on any rank (or
    /// `KOLO_NVLINK_ALLREDUCE=0` in its environment) keeps every rank on
    /// NCCL, and registers no buffers.
    pub peer_allreduce: bool,
}

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions {
            device: None,
            copy_engine: CopyEngine::Off,
            op_timeout: Duration::from_secs(300),
            teardown_timeout: Duration::from_secs(10),
            mode: None,
            peer_allreduce: true,
        }
    }
}
