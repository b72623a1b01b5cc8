//! NCCL channels (feature `nccl`): every channel of a pipeline a two-rank
//! NCCL communicator, each end on its rank's GPU.
//!
//! NCCL has no tags and matches a pair's sends and receives in issue order
//! — exactly a one-way channel's FIFO, so a channel needs no more than a
//! communicator of its two ends. Two ways to build them:
//!
//! - **Threads** (one process, one thread per GPU; kolo-nccl's thread
//!   mode): [`nccl_channels`] builds both ends of every channel of the
//!   pipeline ([`crate::pair_channels`] over `NcclComm::init` on a
//!   two-rank kolo-threads controller), each end on the GPU of its rank,
//!   and deals them out per rank like [`crate::pair_channels`].
//! - **Processes** (one process per GPU under `mpirun`; process mode;
//!   features `nccl` and `mpi`): `nccl_mpi_channels` builds this rank's
//!   ends. Per channel, in the same global order on every rank, the two
//!   ends split a pair communicator off the MPI world
//!   (`MpiComm::split`), and `NcclComm::init` runs over it: pair rank 0
//!   (the sender) makes NCCL's unique id, which crosses the pair's MPI
//!   control plane. NCCL then picks its own path — NVLink or PCIe peer to
//!   peer on one host, its network transport across hosts. Failures are
//!   agreed over the world after each channel, so every rank gets the same
//!   error and none waits forever.
//!
//! Both are [`NcclChannel`]s (generic over the controller they were built
//! over), so [`crate::Pipeline::start`] gives each helper thread its
//! channel the same way.
//!
//! An [`NcclChannel`] is a [`Channel`] that moves device memory:
//! [`crate::DeviceTensor`]s sent with [`crate::Pipeline::send_device`] go
//! GPU to GPU — the 80-byte header as host bytes, then `ncclSend` on the
//! tensor's buffer and, on the receiver, `ncclRecv` into a buffer
//! allocated on its GPU once the header has arrived: no host copy of the
//! elements. Host tensors ([`crate::Pipeline::send`]) and the headers go
//! through kolo-nccl's `HostStaging` — upload, `ncclSend` / `ncclRecv`,
//! download — so every pipeline test runs over NCCL unchanged. Each send
//! is issued and waited for at once, so its failure is the send's error.
//!
//! What to know:
//! - NCCL refuses a communicator with two ranks on one GPU ("Duplicate GPU
//!   detected", `ncclInvalidUsage`): the two ranks of every channel need
//!   different GPUs (a pipeline of N ranks on N GPUs always has that).
//!   Both constructors refuse first, naming both ranks and the device
//!   (under `mpirun`: the GPU's UUID, so ordinals that differ by
//!   `CUDA_VISIBLE_DEVICES` do not matter); ranks that share a GPU but no
//!   channel are fine.
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
//! - Under `mpirun` the channels' pair communicators are used and freed by
//!   the pipeline's helper threads: `MPI_THREAD_MULTIPLE` is needed (and
//!   checked), and the helpers must be waited for before MPI is finalised
//!   ([`crate::Pipeline::helpers`]).

use crate::channel::Channel;
use crate::channels::{pair_channels, ChannelSet};
use crate::device_tensor::DeviceTensor;
use crate::error::PipelineError;
use crate::options::Options;
use crate::plan::channels;
use crate::spec::PipelineSpec;
use crate::tensor::element_count;
use cudarc::driver::CudaStream;
use kolo_nccl::{HostStaging, Mode, NcclComm, NcclError, NcclOptions};
use kolo_protocol::DataType;
use kolo_threads::ThreadComm;
use kolo_transport::{
    with_element_type, Collectives, Controller, Result, Topology, TransportError,
};
use std::sync::Arc;

#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "mpi")]
mod pairing;
#[cfg(feature = "mpi")]
pub use mpi::nccl_mpi_channels;

/// One end of a pipeline channel over NCCL: a two-rank communicator (rank
/// 0 sends, rank 1 receives) and the controller `C` it was built over — a
/// two-rank kolo-threads communicator in thread mode ([`nccl_channels`]),
/// the channel's pair communicator split off the MPI world in process mode
/// (`nccl_mpi_channels`, features `nccl` and `mpi`). A [`Channel`] of host
/// bytes (through kolo-nccl's `HostStaging`) and of device tensors
/// (`ncclSend` / `ncclRecv` on their buffers).
pub struct NcclChannel<C = ThreadComm> {
    comm: NcclComm,
    ctrl: C,
    /// The stream received device tensors are allocated on (created on
    /// the first): not the NCCL stream, where the next receive may already
    /// wait for its peer, so a caller's work on a received tensor (a copy
    /// to the host on its own stream) never queues behind it.
    delivery: Option<Arc<CudaStream>>,
}

impl<C: Controller> NcclChannel<C> {
    /// An end of `comm`, built over `ctrl` (the same two ranks).
    fn new(comm: NcclComm, ctrl: C) -> Self {
        NcclChannel {
            comm,
            ctrl,
            delivery: None,
        }
    }

    /// The NCCL communicator (its device, stream, health).
    pub fn comm(&mut self) -> &mut NcclComm {
        &mut self.comm
    }

    fn staging(&mut self) -> HostStaging<'_, C> {
        HostStaging::new(&mut self.comm, &mut self.ctrl)
    }

    fn delivery_stream(&mut self) -> Result<Arc<CudaStream>> {
        if let Some(stream) = &self.delivery {
            return Ok(Arc::clone(stream));
        }
        let stream = self
            .comm
            .device()
            .context()
            .new_stream()
            .map_err(|e| cuda_error("creating the delivery stream", e))?;
        self.delivery = Some(Arc::clone(&stream));
        Ok(stream)
    }
}

fn cuda_error(what: &str, e: cudarc::driver::DriverError) -> TransportError {
    TransportError::Backend(format!("CUDA, {what}: {e:?}"))
}

fn tensor_error(e: crate::TensorError) -> TransportError {
    TransportError::InvalidArgument(e.to_string())
}

impl<C> std::fmt::Debug for NcclChannel<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclChannel")
            .field("comm", &self.comm)
            .finish_non_exhaustive()
    }
}

impl<C> Topology for NcclChannel<C> {
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

impl<C: Controller + Send + 'static> Channel for NcclChannel<C> {
    /// Sends `bytes` to `peer` and waits until NCCL has delivered them. (A
    /// plain `HostStaging::send` only stages the data until the next
    /// receive from the peer, which a one-way channel never has; a send
    /// with an empty receive in one group is issued at once.)
    fn send_bytes(&mut self, bytes: &[u8], peer: usize, tag: u32) -> Result<()> {
        self.staging().sendrecv(bytes, peer, &mut [], peer, tag)
    }

    fn recv_bytes(&mut self, bytes: &mut [u8], peer: usize, tag: u32) -> Result<()> {
        self.staging().recv(bytes, peer, tag)
    }

    fn moves_device(&self) -> bool {
        true
    }

    /// `ncclSend` on the tensor's buffer (which must live on this end's
    /// GPU), waited for: NCCL has delivered it when this returns.
    fn send_device(&mut self, tensor: &DeviceTensor, peer: usize) -> Result<()> {
        with_element_type!(tensor.dtype(), T => {
            let slice = tensor.as_slice::<T>().map_err(tensor_error)?;
            self.comm.send(slice, peer)?.wait()?;
            Ok(())
        })
    }

    /// A buffer of exactly `shape`'s elements on this end's GPU (on the
    /// delivery stream), filled by `ncclRecv`, waited for.
    fn recv_device(
        &mut self,
        dtype: DataType,
        shape: Vec<usize>,
        peer: usize,
    ) -> Result<DeviceTensor> {
        let count = element_count(&shape, dtype).map_err(tensor_error)?;
        let stream = self.delivery_stream()?;
        with_element_type!(dtype, T => {
            let mut slice = stream
                .alloc_zeros::<T>(count)
                .map_err(|e| cuda_error("allocating a received tensor", e))?;
            self.comm.recv(&mut slice, peer)?.wait()?;
            DeviceTensor::new(shape, slice).map_err(tensor_error)
        })
    }
}

/// Both ends of every channel of the pipeline as two-rank NCCL
/// communicators in thread mode, rank `r`'s end on GPU `gpu_of(r)`;
/// element `r` is rank `r`'s set (see [`crate::pair_channels`]).
///
/// `options` is used for every communicator, its `device` and `mode` set
/// per end (thread mode). A channel whose two ends `gpu_of` puts on one
/// GPU is an error naming both ranks and the GPU, before any communicator
/// is created; a communicator that cannot be created (no GPU, no NCCL) is
/// an error naming the channel and the GPUs.
pub fn nccl_channels(
    spec: &PipelineSpec,
    run: &Options,
    options: &NcclOptions,
    gpu_of: impl Fn(usize) -> usize,
) -> std::result::Result<Vec<ChannelSet<NcclChannel>>, PipelineError> {
    // Checked first: a refusal after some channels exist would drop their
    // ends one by one, each waiting out its teardown bound for its peer.
    if let Some(key) = channels(spec, run)?
        .into_iter()
        .find(|key| gpu_of(key.sender) == gpu_of(key.receiver))
    {
        return Err(PipelineError::Start(format!(
            "NCCL channel {key}: ranks {} and {} both use device {}; NCCL needs the two ends \
             of a channel on different GPUs",
            key.sender,
            key.receiver,
            gpu_of(key.sender)
        )));
    }
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
                    NcclComm::init(&mut ctrl, options).map(|comm| NcclChannel::new(comm, ctrl))
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

    /// Two ends on one GPU are refused before any communicator exists,
    /// naming both ranks and the device (no GPU needed).
    #[test]
    fn two_ends_on_one_gpu_are_refused_first() {
        let spec = PipelineSpec::with_widths(&[1, 1, 1]).tensor(
            TensorSpec::new("skip", DataType::F32, 1)
                .from_stage(0)
                .to_stage(2),
        );
        let run = Options::training(2);
        let text = nccl_channels(&spec, &run, &NcclOptions::default(), |rank| rank % 2)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            text.contains("NCCL channel Activations of 'skip' from rank 0 to rank 2: ranks 0 and 2 both use device 0"),
            "{text}"
        );
    }
}
