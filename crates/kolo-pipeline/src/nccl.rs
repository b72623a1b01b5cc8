//! NCCL channels (feature `nccl`): every channel of a pipeline a two-rank
//! NCCL communicator, for pipelines whose ranks are threads of one process,
//! one GPU each (kolo-nccl's thread mode).
//!
//! NCCL has no tags and matches a pair's sends and receives in issue order
//! — exactly a one-way channel's FIFO, so a channel needs no more than a
//! communicator of its two ends. [`nccl_channels`] builds both ends of
//! every channel of the pipeline ([`crate::pair_channels`] over
//! `NcclComm::init` on a two-rank kolo-threads controller), each end on
//! the GPU of its rank, and deals them out per rank like
//! [`crate::pair_channels`]; [`crate::Pipeline::start`] then gives each
//! helper thread its channel's [`NcclChannel`].
//!
//! An [`NcclChannel`] carries the pipeline's host tensors through
//! kolo-nccl's `HostStaging` — upload, `ncclSend` / `ncclRecv`, download —
//! so between GPUs of one host the bytes cross over NVLink or PCIe
//! peer-to-peer, and every pipeline test runs over NCCL unchanged. Each
//! send is issued and waited for at once, so its failure is the send's
//! error.
//!
//! What to know:
//! - NCCL refuses a communicator with two ranks on one GPU ("Duplicate GPU
//!   detected", `ncclInvalidUsage`): the two ranks of every channel need
//!   different GPUs (a pipeline of N ranks on N GPUs always has that).
//! - A receiving helper keeps a receive pending until its peer sends. A
//!   pending operation fails after `NcclOptions::op_timeout` and breaks the
//!   channel: choose it above the longest gap between two messages of a
//!   channel (a stage's longest step).
//! - Each channel is an NCCL communicator with its own stream and resources;
//!   a pipeline of many tensors and wide stages opens many. Pending NCCL
//!   receive kernels on several communicators of one GPU each hold a few
//!   SMs while they wait.
//! - Dropping a thread-mode communicator waits (at most
//!   `NcclOptions::teardown_timeout`) for the other end to be dropped too;
//!   ends that are never started are dropped with their set.

use crate::channels::{pair_channels, ChannelSet};
use crate::error::PipelineError;
use crate::options::Options;
use crate::spec::PipelineSpec;
use kolo_nccl::{HostStaging, Mode, NcclComm, NcclError, NcclOptions};
use kolo_threads::ThreadComm;
use kolo_transport::{Collectives, Element, MemoryKind, Result, Topology};

/// One end of a pipeline channel over NCCL: a two-rank communicator (rank
/// 0 sends, rank 1 receives) and the controller it was built over.
/// Implements kolo's host [`Collectives`] through kolo-nccl's
/// `HostStaging`.
pub struct NcclChannel {
    comm: NcclComm,
    ctrl: ThreadComm,
}

impl NcclChannel {
    /// The NCCL communicator (its device, stream, health).
    pub fn comm(&mut self) -> &mut NcclComm {
        &mut self.comm
    }

    fn staging(&mut self) -> HostStaging<'_, ThreadComm> {
        HostStaging::new(&mut self.comm, &mut self.ctrl)
    }
}

impl std::fmt::Debug for NcclChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclChannel")
            .field("comm", &self.comm)
            .finish_non_exhaustive()
    }
}

impl Topology for NcclChannel {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn local_rank(&self) -> usize {
        self.comm.local_rank()
    }
    fn local_size(&self) -> usize {
        self.comm.local_size()
    }
}

impl Collectives for NcclChannel {
    fn memory(&self) -> MemoryKind {
        MemoryKind::Host
    }

    /// Sends `buf` to `peer` and waits until NCCL has delivered it. (A
    /// plain `HostStaging::send` only stages the data until the next
    /// receive from the peer, which a one-way channel never has; a send
    /// with an empty receive in one group is issued at once.)
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.staging().sendrecv(buf, peer, &mut [], peer, tag)
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.staging().recv(buf, peer, tag)
    }
}

/// Both ends of every channel of the pipeline as two-rank NCCL
/// communicators in thread mode, rank `r`'s end on GPU `gpu_of(r)`;
/// element `r` is rank `r`'s set (see [`crate::pair_channels`]).
///
/// `options` is used for every communicator, its `device` and `mode` set
/// per end (thread mode). A communicator that cannot be created (no GPU,
/// no NCCL, two ends on one GPU) is an error naming the channel and the
/// GPUs.
pub fn nccl_channels(
    spec: &PipelineSpec,
    run: &Options,
    options: &NcclOptions,
    gpu_of: impl Fn(usize) -> usize,
) -> std::result::Result<Vec<ChannelSet<NcclChannel>>, PipelineError> {
    pair_channels(spec, run, |key| {
        let gpus = [gpu_of(key.sender), gpu_of(key.receiver)];
        open_pair(gpus, options).map_err(|e| {
            PipelineError::Start(format!(
                "NCCL channel {key} (GPU {} to GPU {}): {e}",
                gpus[0], gpus[1]
            ))
        })
    })
}

/// Rank 0 (on `gpus[0]`) and rank 1 (on `gpus[1]`) of a new two-rank
/// communicator, created together on two threads (`NcclComm::init` is
/// collective).
fn open_pair(
    gpus: [usize; 2],
    options: &NcclOptions,
) -> std::result::Result<(NcclChannel, NcclChannel), NcclError> {
    let ctrls = kolo_threads::communicators(2)
        .map_err(|e| NcclError::InvalidArgument(format!("two-rank controller: {e}")))?;
    let mut ends: Vec<std::result::Result<NcclChannel, NcclError>> = std::thread::scope(|s| {
        let handles: Vec<_> = ctrls
            .into_iter()
            .zip(gpus)
            .map(|(mut ctrl, gpu)| {
                let options = NcclOptions {
                    device: Some(gpu),
                    mode: Some(Mode::ThreadPerGpu),
                    ..options.clone()
                };
                s.spawn(move || {
                    NcclComm::init(&mut ctrl, options).map(|comm| NcclChannel { comm, ctrl })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(NcclError::InvalidArgument(
                        "creating a channel end panicked".into(),
                    ))
                })
            })
            .collect()
    });
    let receiver = ends.pop();
    let sender = ends.pop();
    match (sender, receiver) {
        (Some(Ok(sender)), Some(Ok(receiver))) => Ok((sender, receiver)),
        (Some(Err(e)), _) | (_, Some(Err(e))) => Err(e),
        _ => Err(NcclError::InvalidArgument("a channel has two ends".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::TensorSpec;
    use kolo_protocol::DataType;

    /// Without a GPU (CI) the channels are an error naming the channel and
    /// its GPUs, not a panic or a hang; with two GPUs they are both ends of
    /// every channel.
    #[test]
    fn channels_are_created_or_the_error_names_the_channel() {
        let spec = PipelineSpec::with_widths(&[1, 1]).tensor(
            TensorSpec::new("h1", DataType::F32, 1)
                .from_stage(0)
                .to_stage(1),
        );
        let run = Options::training(2);
        let devices = kolo_nccl::probe::platform().map_or(0, |p| p.devices);
        match nccl_channels(&spec, &run, &NcclOptions::default(), |rank| rank) {
            Ok(sets) => {
                assert!(devices >= 2, "channels on {devices} GPUs");
                let ends: Vec<usize> = sets.iter().map(ChannelSet::len).collect();
                assert_eq!(ends, [2, 2]);
            }
            Err(e) => {
                assert!(devices < 2, "{e}");
                let text = e.to_string();
                assert!(
                    text.contains(
                        "NCCL channel Activations of 'h1' from rank 0 to rank 1 (GPU 0 to GPU 1)"
                    ),
                    "{text}"
                );
            }
        }
    }
}
