//! `nccl_mpi_channels` under a real `mpirun` (features `nccl` and `mpi`),
//! part of the `mpirun` test binary: without GPUs (CI) every rank gets
//! the same error naming the channel and the rank that failed — never a
//! hang; with two GPUs, every rank gets its ends. Below
//! `MPI_THREAD_MULTIPLE` every rank is refused before any collective.

use super::common::spec_for;
use kolo_mpi::MpiComm;
use kolo_nccl::NcclOptions;
use kolo_pipeline::nccl::nccl_mpi_channels;
use kolo_pipeline::{Options, StagePlan};
use kolo_transport::{Collectives, Topology};

/// One rank: channels for widths (1, 1), on GPU (local rank).
pub fn channels_or_a_named_error(funneled: bool) -> Result<(), String> {
    let mut world = MpiComm::init(funneled).map_err(|e| format!("MPI init: {e}"))?;
    let rank = world.rank();
    let spec = spec_for(&[1, 1]);
    let options = Options::training(4);
    let plan = StagePlan::new(&spec, rank).map_err(|e| e.to_string())?;
    let devices = kolo_nccl::probe::platform().map_or(0, |p| p.devices);
    let device = world.local_rank();
    let opened = nccl_mpi_channels(&mut world, &plan, &options, device, &NcclOptions::default());
    let expected = if funneled {
        "needs MPI_THREAD_MULTIPLE"
    } else {
        "could not open its NCCL channels: NCCL channel Activations of 'h1' from rank 0 to rank 1"
    };
    let checked = match opened {
        Ok(set) if devices >= 2 && !funneled => {
            // h1 forward and backward, labels forward: three ends each.
            if set.len() == 3 {
                Ok(())
            } else {
                Err(format!("rank {rank} got {} channel ends, not 3", set.len()))
            }
        }
        Ok(set) => Err(format!(
            "rank {rank}: {} channel ends on {devices} GPUs (funneled: {funneled})",
            set.len()
        )),
        Err(e) if e.to_string().contains(expected) => {
            if rank == 0 {
                println!("  {e}");
            }
            Ok(())
        }
        Err(e) => Err(format!("rank {rank}: expected '{expected}', got: {e}")),
    };
    checked?;
    world.barrier().map_err(|e| e.to_string())
}
