//! [`Kolo::init`]: one call that starts this process's engine the way its
//! launcher and the environment say — what a binding (C, Python) calls,
//! since it cannot know how its program was started.

use crate::config::{BackendKind, Config, BACKEND};
use crate::error::Error;
use crate::kolo::Kolo;
use std::ffi::OsString;

/// How this process was started, as its environment tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Launch {
    /// By nobody in particular: a job of one process.
    Alone,
    /// By a launcher that sets torchrun's variables (torchrun, kolo-run,
    /// Kubeflow, Ray, ...): rank `rank` of `size`.
    Torchrun { rank: usize, size: usize },
    /// By mpirun (OpenMPI's or a PMI's variables).
    Mpirun,
}

impl Launch {
    /// The launch `lookup` (the environment) describes.
    pub(crate) fn from_lookup(lookup: &dyn Fn(&str) -> Option<OsString>) -> Launch {
        let number = |names: &[&str]| {
            names
                .iter()
                .find_map(|name| lookup(name)?.to_str()?.trim().parse::<usize>().ok())
        };
        if number(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"]).is_some() {
            return Launch::Mpirun;
        }
        match number(&["KOLO_WORLD_SIZE", "WORLD_SIZE"]) {
            Some(size) => Launch::Torchrun {
                rank: number(&["KOLO_RANK", "RANK"]).unwrap_or(0),
                size,
            },
            None => Launch::Alone,
        }
    }
}

/// The backend of a process launched as `launch`: `configured` where it
/// was chosen (`explicit`: a builder setting other than the default, or
/// `KOLO_BACKEND`), else the launcher's. Threads serve a job of one
/// process only.
pub(crate) fn choose(
    configured: BackendKind,
    explicit: bool,
    launch: Launch,
) -> Result<BackendKind, Error> {
    let chosen = match launch {
        _ if explicit => configured,
        Launch::Alone => BackendKind::Threads,
        Launch::Torchrun { .. } => BackendKind::Ucx,
        Launch::Mpirun => BackendKind::Mpi,
    };
    if chosen == BackendKind::Threads {
        if let Launch::Torchrun { rank, size } = launch {
            if size > 1 {
                return Err(Error::Start {
                    message: format!(
                        "{BACKEND}=threads runs ranks as threads of one process, but this process \
                         is rank {rank} of {size} started by a launcher: use ucx (or mpi under mpirun)"
                    ),
                });
            }
        }
    }
    Ok(chosen)
}

impl Kolo {
    /// Starts this process's engine as its environment says; call once
    /// per process. The backend is `config.backend` where it was chosen
    /// (the builder, or `KOLO_BACKEND`); otherwise the launcher's:
    /// torchrun's variables (`WORLD_SIZE`, `RANK`, ...: torchrun,
    /// `kolo-run`, Kubeflow, Ray) join the job over UCX (the `ucx`
    /// feature), mpirun's over MPI (`mpi`), and a process started alone is
    /// a job of one rank on kolo-threads. With the `nccl` feature and
    /// [`Config::gpu`] on (`KOLO_GPU`, default), the ranks of a host with
    /// a GPU for each of them start the GPU engine, each on its local
    /// rank's GPU (device tensors through NCCL); with fewer GPUs than
    /// ranks they all stay on the host. A backend that was not
    /// built is an [`Error::Start`] naming the feature.
    pub fn init(config: Config) -> Result<Kolo, Error> {
        config.validate()?;
        let lookup = |name: &str| std::env::var_os(name);
        let explicit = config.backend != BackendKind::Threads
            || lookup(BACKEND).is_some_and(|v| !v.is_empty());
        let launch = Launch::from_lookup(&lookup);
        match choose(config.backend, explicit, launch)? {
            BackendKind::Threads => start_alone(config),
            BackendKind::Mpi => start_mpi(config),
            BackendKind::Ucx => start_ucx(config),
        }
    }
}

/// A job of one process on kolo-threads (on its GPU where it has one).
fn start_alone(config: Config) -> Result<Kolo, Error> {
    #[cfg(feature = "nccl")]
    if config.gpu && gpus() > 0 {
        return crate::nccl::start_one(config);
    }
    let comm = crate::threads::lone_comm()?;
    Kolo::start_with_abort(comm, config, |comm, message| comm.fail(message))
}

#[cfg(feature = "mpi")]
fn start_mpi(config: Config) -> Result<Kolo, Error> {
    #[cfg(feature = "nccl")]
    if config.gpu && every_local_rank_has_a_gpu(&["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"])
    {
        return Kolo::init_nccl_mpi(config);
    }
    Kolo::init_mpi(config)
}

#[cfg(not(feature = "mpi"))]
fn start_mpi(_: Config) -> Result<Kolo, Error> {
    Err(not_built("mpi", "a job started by mpirun"))
}

#[cfg(feature = "ucx")]
fn start_ucx(config: Config) -> Result<Kolo, Error> {
    #[cfg(feature = "nccl")]
    if config.gpu && every_local_rank_has_a_gpu(&["KOLO_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"]) {
        return Kolo::init_nccl_ucx(config);
    }
    Kolo::init_ucx(config)
}

#[cfg(not(feature = "ucx"))]
fn start_ucx(_: Config) -> Result<Kolo, Error> {
    Err(not_built("ucx", "a job started with torchrun's variables"))
}

/// The error of a backend kolo was built without.
#[cfg(not(all(feature = "mpi", feature = "ucx")))]
fn not_built(feature: &str, job: &str) -> Error {
    Error::Start {
        message: format!("kolo was built without the `{feature}` feature, which {job} needs"),
    }
}

/// The GPUs this process sees (0 without a usable driver and NCCL).
#[cfg(feature = "nccl")]
fn gpus() -> usize {
    kolo_nccl::probe::platform().map_or(0, |p| p.devices)
}

/// True when this host has a GPU for each of its ranks (their number as
/// the first of `names` gives it; 1 if none). Every rank of a host decides
/// alike, so a job never mixes GPU and host engines: with fewer GPUs than
/// ranks (two processes on one GPU, which NCCL refuses) all run on the host.
#[cfg(feature = "nccl")]
#[cfg_attr(not(any(feature = "mpi", feature = "ucx")), allow(dead_code))]
fn every_local_rank_has_a_gpu(names: &[&str]) -> bool {
    let local_size = names
        .iter()
        .find_map(|name| std::env::var(name).ok()?.trim().parse().ok())
        .unwrap_or(1usize);
    let gpus = gpus();
    gpus > 0 && gpus >= local_size
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(vars: &[(&str, &str)]) -> Launch {
        Launch::from_lookup(&|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn the_launcher_decides_unless_a_backend_was_chosen() {
        assert_eq!(launch(&[]), Launch::Alone);
        let torchrun = launch(&[("WORLD_SIZE", "4"), ("RANK", "2")]);
        assert_eq!(torchrun, Launch::Torchrun { rank: 2, size: 4 });
        let overridden = launch(&[("WORLD_SIZE", "4"), ("KOLO_WORLD_SIZE", "2")]);
        assert_eq!(overridden, Launch::Torchrun { rank: 0, size: 2 });
        let mpirun = launch(&[("OMPI_COMM_WORLD_SIZE", "2"), ("WORLD_SIZE", "2")]);
        assert_eq!(mpirun, Launch::Mpirun);

        let threads = BackendKind::Threads;
        assert_eq!(
            choose(threads, false, Launch::Alone),
            Ok(BackendKind::Threads)
        );
        assert_eq!(choose(threads, false, torchrun), Ok(BackendKind::Ucx));
        assert_eq!(choose(threads, false, mpirun), Ok(BackendKind::Mpi));
        assert_eq!(
            choose(BackendKind::Mpi, true, torchrun),
            Ok(BackendKind::Mpi)
        );
        let alone = Launch::Torchrun { rank: 0, size: 1 };
        assert_eq!(choose(threads, true, alone), Ok(BackendKind::Threads));
        let Err(Error::Start { message }) = choose(threads, true, torchrun) else {
            panic!("threads cannot serve a launched job of 4");
        };
        assert!(
            message.contains("rank 2 of 4") && message.contains("ucx"),
            "{message}"
        );
    }

    #[test]
    fn a_process_alone_runs_one_rank() {
        let kolo = start_alone(Config::default().gpu(false)).unwrap();
        assert_eq!((kolo.rank(), kolo.size(), kolo.local_size()), (0, 1, 1));
        let mut x = [2.0f32; 3];
        kolo.allreduce("x", &mut x, crate::ReduceOp::Sum).unwrap();
        assert_eq!(x, [2.0; 3]);
        assert_eq!(kolo.allgather("g", &[1u8, 2]).unwrap(), [1, 2]);
        kolo.shutdown().unwrap();
    }
}
