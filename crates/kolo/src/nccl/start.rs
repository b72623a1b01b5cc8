//! Starting GPU engines: one thread per GPU in this process.

use super::plane::NcclPlane;
use crate::config::Config;
use crate::engine::placement::DevicePlane;
use crate::engine::watchdog::Guards;
use crate::error::Error;
use crate::kolo::Kolo;
use crate::threads::{run_ranks, Sets};
use kolo_nccl::{Mode, NcclComm, NcclOptions};
use kolo_threads::ThreadComm;
use kolo_transport::Topology;

/// Runs `f` on `gpus` ranks, each a thread of this process with its own
/// GPU engine on device `rank` (kolo-threads for negotiation and host
/// tensors, NCCL for device tensors), and returns every rank's result in
/// rank order. Failures and shutdown behave as in [`crate::threads::run`].
///
/// Without a CUDA driver, NCCL or enough GPUs this is an
/// [`Error::Start`] saying which, on every rank — never a panic.
pub fn run<R, F>(gpus: usize, config: Config, f: F) -> Result<Vec<R>, Error>
where
    R: Send,
    F: Fn(&Kolo) -> Result<R, Error> + Sync,
{
    run_with(gpus, config, NcclOptions::default(), f)
}

/// [`run`] with the communicators' options (operation and teardown
/// timeouts, ...). The device of rank r is r unless `options.device` pins
/// one; the mode is thread-per-GPU unless `options.mode` says otherwise.
pub fn run_with<R, F>(
    gpus: usize,
    config: Config,
    options: NcclOptions,
    f: F,
) -> Result<Vec<R>, Error>
where
    R: Send,
    F: Fn(&Kolo) -> Result<R, Error> + Sync,
{
    let start = |comm: ThreadComm, config: &Config, timeline, guards| {
        let mut options = bounded(options.clone(), config);
        let rank = comm.rank();
        options.device = options.device.or(Some(rank));
        options.mode = options.mode.or(Some(Mode::ThreadPerGpu));
        Kolo::start_engine(
            move || with_nccl(comm, options),
            config.clone(),
            |comm: &mut ThreadComm, message: &str| comm.fail(message),
            timeline,
            guards,
        )
    };
    run_ranks(gpus, &config, start, Sets::Refuse, f)
}

/// A GPU engine of one rank, on GPU 0 (a process started alone, see
/// [`Kolo::init`]).
pub(crate) fn start_one(config: Config) -> Result<Kolo, Error> {
    let comm = crate::threads::lone_comm()?;
    let options = bounded(
        NcclOptions {
            device: Some(0),
            mode: Some(Mode::ThreadPerGpu),
            ..NcclOptions::default()
        },
        &config,
    );
    Kolo::start_engine(
        move || with_nccl(comm, options),
        config,
        |comm: &mut ThreadComm, message: &str| comm.fail(message),
        None,
        Guards::default(),
    )
}

/// `options` with its operation timeout no longer than kolo's
/// ([`Config::timeout`]): the completion thread fails a device operation
/// pending past it, and NCCL's asynchronous errors, breaking the
/// communicator, which is then aborted (`ncclCommAbort`) within the
/// teardown bound.
pub(crate) fn bounded(mut options: NcclOptions, config: &Config) -> NcclOptions {
    if let Some(timeout) = config.timeout {
        options.op_timeout = options.op_timeout.min(timeout);
    }
    options
}

/// Creates the NCCL communicator over `ctrl` (collective over every rank)
/// and pairs it with the controller: the engine's backend and device plane.
pub(crate) fn with_nccl<C: kolo_transport::Controller>(
    mut ctrl: C,
    options: NcclOptions,
) -> Result<(C, Option<Box<dyn DevicePlane>>), Error> {
    let comm = NcclComm::init(&mut ctrl, options).map_err(|e| Error::Start {
        message: format!("cannot start NCCL on rank {}: {e}", ctrl.rank()),
    })?;
    Ok((ctrl, Some(Box::new(NcclPlane::new(comm)))))
}
