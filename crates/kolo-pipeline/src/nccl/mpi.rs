//! NCCL channels for pipelines whose ranks are processes, one GPU each
//! (`mpirun`; features `nccl` and `mpi`): [`nccl_mpi_channels`].
//!
//! Per channel of the pipeline, in one global order, the two ends split a
//! pair communicator off the MPI world (`MpiComm::split`; every other rank
//! passes no color), check that they are not one GPU, and bootstrap a
//! two-rank NCCL communicator in process mode over it (`NcclComm::init`,
//! whose unique id goes from pair rank 0 to rank 1 over the pair's MPI
//! control plane). NCCL then picks its own path between the two GPUs: peer
//! to peer (NVLink, PCIe) on one host, the network across hosts.

use super::pairing::{encode_status, first_failure, pair_end, shared_gpu, GpuId, PairEnd};
use super::NcclChannel;
use crate::channels::{ChannelKey, ChannelSet, Endpoint};
use crate::error::PipelineError;
use crate::options::Options;
use crate::plan::{channels, StagePlan};
use kolo_mpi::{MpiComm, MpiError, ThreadLevel};
use kolo_nccl::{Mode, NcclComm, NcclOptions};
use kolo_transport::{Controller, Topology};
use std::os::raw::c_int;

/// This rank's ends of its channels as two-rank NCCL communicators in
/// process mode, on CUDA device `device` (of this process), bootstrapped
/// over `world` — for pipelines whose ranks are MPI processes, the usual
/// `mpirun` deployment. Hand the set to [`crate::Pipeline::start`]:
/// device tensors then move GPU to GPU
/// ([`crate::Pipeline::send_device`]), host tensors through kolo-nccl's
/// staging, exactly as with [`super::nccl_channels`] in thread mode.
///
/// `options` serves every communicator, with `device` and process mode
/// set (so its `device` is ignored, and copy engines, a thread-mode
/// feature, are an error); its `op_timeout` bounds a receive waiting for
/// its peer (see the module docs).
///
/// **Collective over `world`**: every rank calls it at the same point of
/// the program, with the same spec and options, and, like
/// [`crate::duplicate_channels`], works through the pipeline's whole
/// channel list ([`crate::channels`]) in its one order: per channel one
/// `MpiComm::split` of the world (the channel's two ends get a pair
/// communicator, sender first), the pair's GPU check and `NcclComm::init`
/// (collective over the pair only), then one agreement over the world on
/// whether the channel opened. A failure anywhere — no GPU or NCCL, two
/// ends on one GPU, a failed `ncclCommInitRank` — is the same error on
/// every rank, naming the channel and the rank that reported it, and
/// nobody is left waiting. Below `MPI_THREAD_MULTIPLE` (the channels'
/// communicators are used and freed by the pipeline's helper threads) it
/// fails on every rank before any collective, naming the level.
///
/// Two ends of a channel on one GPU (same host, same GPU UUID, whatever
/// the ordinals) are refused before NCCL sees them, naming both ranks and
/// the GPU; ranks that share a GPU but no channel are fine. Opening is
/// sequential — one NCCL bootstrap per channel — so a pipeline of many
/// channels takes a moment to start.
pub fn nccl_mpi_channels(
    world: &mut MpiComm,
    plan: &StagePlan,
    run: &Options,
    device: usize,
    options: &NcclOptions,
) -> Result<ChannelSet<NcclChannel<MpiComm>>, PipelineError> {
    let granted = world.thread_level();
    if granted < ThreadLevel::Multiple {
        let e = MpiError::ThreadLevel {
            operation: "kolo_pipeline::nccl::nccl_mpi_channels (communicators for helper threads)",
            needed: ThreadLevel::Multiple,
            granted,
        };
        return Err(PipelineError::Start(e.to_string()));
    }
    // The same list on every rank: it depends on the spec and options only
    // (an invalid description is an error on every rank, before any
    // collective).
    let keys = channels(plan.spec(), run)?;
    let rank = world.rank();
    let layout = if (plan.rank(), plan.spec().world_size) == (rank, world.size()) {
        Ok(())
    } else {
        Err(format!(
            "rank {rank} of {} of the MPI world was given the plan of rank {} of {}",
            world.size(),
            plan.rank(),
            plan.spec().world_size
        ))
    };
    agree(world, layout)?;
    let mut set = ChannelSet::new(rank);
    // Why this cannot deadlock: every rank runs this loop over the same
    // keys in the same order, and the only calls that wait for other
    // ranks are (1) the split and the agreement, collective over the whole
    // world, and (2) the pair's GPU check and `NcclComm::init` (blocking
    // `ncclCommInitRank`), collective over the channel's two ends only.
    // When a rank is in channel i's (2), both ends of i have finished
    // split i, and neither has anything else to do before its (2) of
    // channel i: they meet there. Ranks off the channel go on to the
    // agreement of channel i, which waits until the two ends are done. So
    // at any time every rank waits either in one world collective that all
    // ranks reach, or in the pair step of the one channel whose both ends
    // run it — never in a cycle. (Opening channels in different orders on
    // different ranks could: A waiting in init of channel (A, B) while B
    // waits in init of (B, C) and C in (C, A).)
    for key in keys {
        let end = pair_end(&key, rank);
        let opened = open_end(world, &key, end, device, options);
        agree(world, opened.as_ref().map(|_| ()).map_err(Clone::clone))?;
        if let (Ok(Some(comm)), Some(end)) = (opened, end) {
            set.insert(
                key,
                Endpoint {
                    comm,
                    peer: end.peer,
                },
            );
        }
    }
    Ok(set)
}

/// Every rank's `status` over `world`: the first failure (in rank order)
/// becomes the same error on every rank.
fn agree(world: &mut MpiComm, status: Result<(), String>) -> Result<(), PipelineError> {
    let statuses = world
        .allgather_bytes(&encode_status(&status))
        .map_err(|e| PipelineError::Start(format!("agreeing on the NCCL channels: {e}")))?;
    match first_failure(&statuses) {
        Some((rank, message)) => Err(PipelineError::Start(format!(
            "rank {rank} could not open its NCCL channels: {message}"
        ))),
        None => Ok(()),
    }
}

/// This rank's part in opening `key`: the world split (every rank), then,
/// on the channel's two ends, the GPU check and the NCCL bootstrap over
/// the pair communicator. `Ok(None)` off the channel.
fn open_end(
    world: &MpiComm,
    key: &ChannelKey,
    end: Option<PairEnd>,
    device: usize,
    options: &NcclOptions,
) -> Result<Option<NcclChannel<MpiComm>>, String> {
    let rank = world.rank();
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        format!("NCCL channel {key}, rank {rank} on device {device}, {what}: {e}")
    };
    let split_key = end.map_or(0, |end| end.rank as c_int);
    let pair = world
        .split(end.map(|_| 0), split_key)
        .map_err(|e| failed("splitting the pair off the world", &e))?;
    let mut pair = match (pair, end) {
        (None, None) => return Ok(None),
        (Some(pair), Some(end)) if (pair.rank(), pair.size()) == (end.rank, 2) => pair,
        (pair, _) => {
            let got = pair.map_or("no communicator".into(), |p| {
                format!("rank {} of {}", p.rank(), p.size())
            });
            return Err(failed("splitting the pair off the world", &got));
        }
    };
    let mine = GpuId {
        ordinal: device,
        uuid: gpu_uuid(device),
    };
    let ids = pair
        .allgather_bytes(&mine.encode())
        .map_err(|e| failed("exchanging GPU ids", &e))?;
    let ids = match ids.as_slice() {
        [a, b] => GpuId::decode(a).zip(GpuId::decode(b)),
        _ => None,
    }
    .ok_or_else(|| failed("exchanging GPU ids", &"malformed ids"))?;
    if let Some(message) = shared_gpu(key, [ids.0, ids.1], pair.local_size() == 2) {
        return Err(message);
    }
    let nccl = NcclOptions {
        device: Some(device),
        mode: Some(Mode::ProcessPerGpu),
        ..options.clone()
    };
    let comm = NcclComm::init(&mut pair, nccl).map_err(|e| {
        format!(
            "NCCL channel {key} (rank {} on device {}, rank {} on device {}): {e}",
            key.sender, ids.0.ordinal, key.receiver, ids.1.ordinal
        )
    })?;
    Ok(Some(NcclChannel::new(comm, pair)))
}

/// The UUID of CUDA device `ordinal`, or `None` without a driver or
/// device (then `NcclComm::init` reports why).
fn gpu_uuid(ordinal: usize) -> Option<[u8; 16]> {
    let (_, count) = kolo_nccl::probe::cuda().ok()?;
    let ordinal = c_int::try_from(ordinal)
        .ok()
        .filter(|&o| (o as usize) < count)?;
    // The driver is loaded and initialised (probed above); cudarc's
    // loader panics only on a missing symbol, which is caught.
    std::panic::catch_unwind(|| {
        use cudarc::driver::result::device;
        device::get(ordinal)
            .and_then(device::get_uuid)
            .ok()
            .map(|uuid| uuid.bytes.map(|b| b as u8))
    })
    .ok()
    .flatten()
}
