//! The threaded engine (PipeDream's helper threads): one thread per link,
//! each owning its channel's communicator, moving exactly its link's
//! messages for the run and exiting. A sender helper takes tensors from
//! its queue and sends header then data — host bytes, or a device tensor
//! moved GPU to GPU by its [`Channel`]; a receiver helper prefetches every
//! message of its link into the link's queue, receiving a device tensor
//! into a buffer its channel allocates once the header has arrived. In forward-only mode each
//! link also has an ack sender on the consumer and an ack receiver on the
//! producer, on a channel of their own.
//!
//! Helpers are never joined while they may still block: closing the
//! pipeline early drops the queues, each sender helper then sends an abort
//! (with the reason) on its channel and exits, which releases its
//! communicator; receiver helpers end when their peer's sender does.

use crate::channel::Channel;
use crate::channels::{ChannelFactory, Endpoint};
use crate::error::PipelineError;
use crate::link::{aborted, byte_len, expect_tensor, protocol, transport_error, Link, Role};
use crate::link_state::{LinkState, Running};
use crate::payload::{Carrier, Payload};
use crate::pipeline::Core;
use crate::tensor::Tensor;
use crate::wire::{reason_bytes, Header, HEADER_LEN};
use crossbeam_channel::{Receiver, Sender};
use kolo_protocol::DataType;
use kolo_transport::{MemoryKind, TransportError};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

/// The caller's handles on the helpers.
pub(crate) struct Threaded {
    /// Per link: the queue of a sender helper.
    tensors: Vec<Option<Sender<(u64, Payload)>>>,
    /// Per link: whether its data channel moves device tensors.
    carriers: Vec<Carrier>,
    /// Per link: the queue of an ack sender helper.
    acks: Vec<Option<Sender<u64>>>,
    handles: Vec<JoinHandle<()>>,
}

impl Threaded {
    /// Opens every channel of the rank and starts its helpers.
    pub(crate) fn spawn<F: ChannelFactory>(
        core: &Arc<Core>,
        factory: &mut F,
    ) -> Result<Threaded, PipelineError> {
        let n = core.links.len();
        let mut threaded = Threaded {
            tensors: (0..n).map(|_| None).collect(),
            acks: (0..n).map(|_| None).collect(),
            carriers: Vec::with_capacity(n),
            handles: Vec::new(),
        };
        let rank = core.plan.rank();
        for i in 0..n {
            let link = &core.links[i].link;
            let data = factory.open(&link.data_channel(rank))?;
            threaded.carriers.push(if data.comm.moves_device() {
                Carrier::DeviceChannel
            } else {
                Carrier::HostChannel
            });
            let acks = if link.acked {
                Some(factory.open(&link.ack_channel(rank))?)
            } else {
                None
            };
            match link.role {
                Role::Send => {
                    let (tx, rx) = crossbeam_channel::unbounded();
                    threaded.tensors[i] = Some(tx);
                    threaded.start(core, i, "send", move |core, state| {
                        send_tensors(core, state, data, rx)
                    })?;
                    if let Some(acks) = acks {
                        threaded.start(core, i, "acks-in", move |_, state| {
                            receive_acks(state, acks)
                        })?;
                    }
                }
                Role::Recv => {
                    threaded.start(core, i, "recv", move |_, state| {
                        receive_tensors(state, data)
                    })?;
                    if let Some(acks) = acks {
                        let (tx, rx) = crossbeam_channel::unbounded();
                        threaded.acks[i] = Some(tx);
                        threaded.start(core, i, "acks-out", move |core, state| {
                            send_acks(core, state, acks, rx)
                        })?;
                    }
                }
            }
        }
        Ok(threaded)
    }

    fn start(
        &mut self,
        core: &Arc<Core>,
        link: usize,
        what: &str,
        body: impl FnOnce(&Core, &LinkState) + Send + 'static,
    ) -> Result<(), PipelineError> {
        let state = &core.links[link];
        let name = format!(
            "kolo-pipe-{}-{}-{}-{}",
            core.plan.rank(),
            state.link.name,
            what,
            state.link.peer
        );
        let core_for_thread = Arc::clone(core);
        core.helpers.start();
        let spawned = thread::Builder::new().name(name).spawn(move || {
            let core = core_for_thread;
            let _running = Running(&core.helpers);
            body(&core, &core.links[link]);
        });
        match spawned {
            Ok(handle) => {
                self.handles.push(handle);
                Ok(())
            }
            Err(e) => {
                core.helpers.done();
                self.close();
                Err(PipelineError::Start(format!(
                    "cannot start a helper thread for tensor '{}': {e}",
                    state.link.name
                )))
            }
        }
    }

    /// What moves link `link`'s data.
    pub(crate) fn carrier(&self, link: usize) -> Carrier {
        self.carriers
            .get(link)
            .copied()
            .unwrap_or(Carrier::HostChannel)
    }

    /// Queues a tensor for link `link`'s sender helper.
    pub(crate) fn post(
        &self,
        core: &Core,
        link: usize,
        minibatch: u64,
        payload: Payload,
    ) -> Result<(), PipelineError> {
        let queue = self.tensors.get(link).and_then(Option::as_ref);
        match queue.map(|q| q.send((minibatch, payload))) {
            Some(Ok(())) => Ok(()),
            _ => Err(core.links[link]
                .failure()
                .unwrap_or(PipelineError::ShutDown)),
        }
    }

    /// Queues an ack for link `link`'s ack sender helper.
    pub(crate) fn post_ack(
        &self,
        core: &Core,
        link: usize,
        minibatch: u64,
    ) -> Result<(), PipelineError> {
        let queue = self.acks.get(link).and_then(Option::as_ref);
        match queue.map(|q| q.send(minibatch)) {
            Some(Ok(())) => Ok(()),
            _ => Err(core.links[link]
                .failure()
                .unwrap_or(PipelineError::ShutDown)),
        }
    }

    /// Closes every queue: sender helpers still owed messages send an
    /// abort and exit. Nothing is joined.
    pub(crate) fn close(&mut self) {
        self.tensors.iter_mut().for_each(|q| *q = None);
        self.acks.iter_mut().for_each(|q| *q = None);
        self.handles.clear();
    }

    /// Closes the queues and joins the helpers (which have all finished:
    /// called after a successful wait).
    pub(crate) fn join(&mut self) {
        self.tensors.iter_mut().for_each(|q| *q = None);
        self.acks.iter_mut().for_each(|q| *q = None);
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

/// A sender helper: header then data for each of the link's minibatches.
fn send_tensors<B: Channel>(
    core: &Core,
    state: &LinkState,
    Endpoint { mut comm, peer }: Endpoint<B>,
    queue: Receiver<(u64, Payload)>,
) {
    let link = &state.link;
    for _ in 0..link.expected {
        let Ok((minibatch, payload)) = queue.recv() else {
            send_abort(core, state, &mut comm, peer);
            return;
        };
        if let Err(e) = send_payload(&mut comm, peer, link.tag, minibatch, &payload) {
            state.fail(channel_error(link, Some(minibatch), e));
            return;
        }
    }
}

/// The header, then the elements: host bytes, or device memory moved by
/// the channel.
fn send_payload<B: Channel>(
    comm: &mut B,
    peer: usize,
    tag: u32,
    minibatch: u64,
    payload: &Payload,
) -> Result<(), TransportError> {
    let (dtype, shape) = match payload {
        Payload::Host(t) => (t.dtype(), t.shape()),
        #[cfg(feature = "nccl")]
        Payload::Device(t) => (t.dtype(), t.shape()),
    };
    let header = Header::Tensor {
        dtype,
        shape: shape.to_vec(),
        minibatch,
        memory: payload.memory(),
    };
    comm.send_bytes(&header.encode(), peer, tag)?;
    match payload {
        Payload::Host(t) => comm.send_bytes(t.as_bytes(), peer, tag),
        #[cfg(feature = "nccl")]
        Payload::Device(t) => comm.send_device(t, peer),
    }
}

/// A receiver helper: prefetches every message of the link.
fn receive_tensors<B: Channel>(state: &LinkState, Endpoint { mut comm, peer }: Endpoint<B>) {
    let link = &state.link;
    for n in 0..link.expected {
        let due = link.nth(n);
        let received = receive_header(link, &mut comm, peer, due).and_then(|header| {
            let (dtype, shape, memory) = expect_tensor(link, due, header)?;
            let payload = match memory {
                MemoryKind::Host => {
                    Payload::Host(receive_host(link, &mut comm, peer, due, dtype, shape)?)
                }
                MemoryKind::Cuda => receive_device(link, &mut comm, peer, due, dtype, shape)?,
            };
            Ok((due.unwrap_or(0), payload))
        });
        match received {
            Ok((minibatch, payload)) => state.deliver(minibatch, payload),
            Err(e) => return state.fail(e),
        }
    }
}

/// A host tensor's bytes, after its header.
fn receive_host<B: Channel>(
    link: &Link,
    comm: &mut B,
    peer: usize,
    due: Option<u64>,
    dtype: DataType,
    shape: Vec<usize>,
) -> Result<Tensor, PipelineError> {
    let mut bytes = vec![0u8; byte_len(&shape, dtype)];
    comm.recv_bytes(&mut bytes, peer, link.tag)
        .map_err(|e| channel_error(link, due, e))?;
    Tensor::from_bytes(dtype, shape, &bytes).map_err(|source| PipelineError::Tensor {
        name: link.name.clone(),
        source,
    })
}

/// A device tensor, after its header: allocated and received by the
/// channel (which must move device memory: a host channel's peer never
/// sends one, so one arriving there is a protocol error).
fn receive_device<B: Channel>(
    link: &Link,
    comm: &mut B,
    peer: usize,
    due: Option<u64>,
    dtype: DataType,
    shape: Vec<usize>,
) -> Result<Payload, PipelineError> {
    if !comm.moves_device() {
        return Err(protocol(
            link,
            format!("a device tensor of shape {shape:?} arrived on a channel of host memory"),
        ));
    }
    #[cfg(feature = "nccl")]
    {
        comm.recv_device(dtype, shape, peer)
            .map(Payload::Device)
            .map_err(|e| channel_error(link, due, e))
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = (peer, due, dtype);
        Err(protocol(
            link,
            "a device tensor arrived, but kolo-pipeline was built without the nccl feature".into(),
        ))
    }
}

/// An ack receiver helper (forward-only, producer side).
fn receive_acks<B: Channel>(state: &LinkState, Endpoint { mut comm, peer }: Endpoint<B>) {
    let link = &state.link;
    for n in 0..link.expected {
        let due = link.nth(n);
        match receive_header(link, &mut comm, peer, due) {
            Ok(Header::Ack { minibatch }) if Some(minibatch) == due => state.acknowledge(),
            Ok(other) => {
                return state.fail(protocol(
                    link,
                    format!("expected the ack of minibatch {due:?}, got {other:?}"),
                ));
            }
            Err(e) => return state.fail(e),
        }
    }
}

/// An ack sender helper (forward-only, consumer side).
fn send_acks<B: Channel>(
    core: &Core,
    state: &LinkState,
    Endpoint { mut comm, peer }: Endpoint<B>,
    queue: Receiver<u64>,
) {
    let link = &state.link;
    for _ in 0..link.expected {
        let Ok(minibatch) = queue.recv() else {
            send_abort(core, state, &mut comm, peer);
            return;
        };
        if let Err(e) = comm.send_bytes(&Header::Ack { minibatch }.encode(), peer, link.tag) {
            state.fail(channel_error(link, Some(minibatch), e));
            return;
        }
    }
}

/// Receives one header; an abort becomes the peer's failure.
fn receive_header<B: Channel>(
    link: &Link,
    comm: &mut B,
    peer: usize,
    due: Option<u64>,
) -> Result<Header, PipelineError> {
    let mut bytes = [0u8; HEADER_LEN];
    comm.recv_bytes(&mut bytes, peer, link.tag)
        .map_err(|e| channel_error(link, due, e))?;
    let header = Header::decode(&bytes).map_err(|m| protocol(link, m))?;
    if let Header::Abort { reason_len } = header {
        let mut reason = vec![0u8; reason_len];
        comm.recv_bytes(&mut reason, peer, link.tag)
            .map_err(|e| channel_error(link, due, e))?;
        return Err(aborted(link, due, &reason));
    }
    Ok(header)
}

fn send_abort<B: Channel>(core: &Core, state: &LinkState, comm: &mut B, peer: usize) {
    let reason = reason_bytes(&core.abort_reason());
    let header = Header::Abort {
        reason_len: reason.len(),
    }
    .encode();
    // Best effort: the peer may be gone already.
    let _ = comm
        .send_bytes(&header, peer, state.link.tag)
        .and_then(|()| comm.send_bytes(&reason, peer, state.link.tag));
}

/// A backend error on a helper's channel. The channel's communicator
/// numbers its two ends 0 and 1, so a peer failure it reports is restated
/// with the peer's global rank (by `transport_error`) and the channel's
/// words kept in parentheses.
fn channel_error(link: &Link, minibatch: Option<u64>, e: TransportError) -> PipelineError {
    match transport_error(link, minibatch, e) {
        PipelineError::PeerFailed {
            name,
            direction,
            peer,
            peer_stage,
            minibatch,
            message,
        } => PipelineError::PeerFailed {
            name,
            direction,
            peer,
            peer_stage,
            minibatch,
            message: format!("its end of the channel closed ({message})"),
        },
        other => other,
    }
}
