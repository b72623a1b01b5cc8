//! The serial engine: one communicator, one loop. For a process with a
//! single communicator (MPI initialised `FUNNELED`), [`run_serial`] runs the
//! caller's closure on a thread of its own and serves its sends and
//! receives from the calling thread, which owns the communicator.
//!
//! The loop moves messages in the order the caller asks for them, never
//! ahead: a receive is posted when the caller waits for it, an ack when
//! the sender needs window room. Sends are queued and go out, in order,
//! just before the next receive, or at `wait` / `finish`. The schedule is
//! then deadlock-free whenever it would be with buffered sends and
//! blocking receives — which needs a backend whose sends complete without
//! their receiver: kolo-threads always; MPI for messages within its eager
//! limit (OpenMPI: `btl_vader_eager_limit`, `btl_tcp_eager_limit`). With
//! larger tensors two neighbouring stages that send to each other at once
//! (1F1B's steady state) would both wait in `send`. No grouping of sends
//! and receives into one transaction avoids that for tensors whose shape
//! travels ahead in a message of its own (the header's receiver learns the
//! body's size only after a transaction ends); such runs want the threaded
//! engine, with a communicator per channel.

use crate::error::PipelineError;
use crate::link::{aborted, byte_len, expect_tensor, protocol, transport_error, Link, Role};
use crate::link_state::LinkState;
use crate::options::Options;
use crate::payload::Payload;
use crate::pipeline::{Core, Engine, Pipeline};
use crate::plan::StagePlan;
use crate::tensor::Tensor;
use crate::wire::{reason_bytes, Header, HEADER_LEN};
use crossbeam_channel::{Receiver, Sender};
use kolo_transport::{Collectives, MemoryKind, TransportError};
use std::fmt;
use std::sync::Arc;
use std::thread;

/// What the caller's side asks of the loop.
pub(crate) enum Op {
    /// Queue a tensor for the link's peer.
    Post {
        link: usize,
        minibatch: u64,
        tensor: Tensor,
    },
    /// Queue an ack for the link's peer.
    PostAck { link: usize, minibatch: u64 },
    /// Receive the link's next message.
    Fetch { link: usize },
    /// Receive the link's next ack.
    FetchAck { link: usize },
    /// Send everything queued.
    Flush {
        reply: Sender<Result<(), PipelineError>>,
    },
    /// Tell every peer still owed a message that this rank gave up.
    Abort { reason: String },
    /// The run completed.
    Finish,
}

/// Runs `f` with a pipeline over the single communicator `comm` (whose
/// ranks are the plan's global ranks), on a thread of its own, while the
/// calling thread moves the messages. When `f` returns `Ok`, the run is
/// finished ([`Pipeline::finish`]); when it returns an error, peers still
/// owed a message from this rank are told it aborted, with the error as
/// reason. A panic in `f` is resumed here after the loop stopped.
///
/// `comm` never leaves the calling thread, so a backend that must be used
/// from the thread that created it (MPI initialised `FUNNELED`) works.
pub fn run_serial<B, R, E, F>(plan: StagePlan, options: Options, comm: &mut B, f: F) -> Result<R, E>
where
    B: Collectives,
    R: Send,
    E: From<PipelineError> + fmt::Display + Send,
    F: FnOnce(&Pipeline) -> Result<R, E> + Send,
{
    if comm.rank() != plan.rank() || comm.size() != plan.spec().world_size {
        return Err(E::from(PipelineError::Start(format!(
            "the communicator is rank {} of {}, the plan rank {} of {}",
            comm.rank(),
            comm.size(),
            plan.rank(),
            plan.spec().world_size
        ))));
    }
    let core = Arc::new(Core::new(plan, options).map_err(E::from)?);
    let (ops, requests) = crossbeam_channel::unbounded();
    let pipe = Pipeline::with_engine(Arc::clone(&core), Engine::Serial(ops));
    let name = format!("kolo-pipe-{}-compute", core.plan.rank());
    thread::scope(|scope| {
        let user = thread::Builder::new()
            .name(name)
            .spawn_scoped(scope, move || {
                let result = f(&pipe);
                match result {
                    Ok(value) => pipe.finish().map(|()| value).map_err(E::from),
                    Err(e) => {
                        pipe.abort(&e.to_string());
                        Err(e)
                    }
                }
            })
            .map_err(|e| {
                E::from(PipelineError::Start(format!(
                    "cannot start the compute thread: {e}"
                )))
            })?;
        Serial::new(comm, &core).serve(requests);
        match user.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// A queued outgoing message.
struct Outgoing {
    link: usize,
    peer: usize,
    tag: u32,
    header: [u8; HEADER_LEN],
    body: Body,
}

enum Body {
    None,
    Tensor(Tensor),
    Bytes(Vec<u8>),
}

impl Body {
    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Body::None => None,
            Body::Tensor(t) => Some(t.as_bytes()),
            Body::Bytes(b) => Some(b),
        }
    }
}

/// The loop's state.
struct Serial<'a, B> {
    comm: &'a mut B,
    core: &'a Core,
    pending: Vec<Outgoing>,
    /// Per link: messages (tensors or acks) this rank has handed over.
    handed: Vec<u64>,
    /// Set by the first backend failure: the communicator's state is then
    /// unknown, so everything after it fails the same way.
    broken: Option<PipelineError>,
    done: bool,
}

impl<'a, B: Collectives> Serial<'a, B> {
    fn new(comm: &'a mut B, core: &'a Core) -> Self {
        Serial {
            comm,
            core,
            pending: Vec::new(),
            handed: vec![0; core.links.len()],
            broken: None,
            done: false,
        }
    }

    fn serve(mut self, requests: Receiver<Op>) {
        while let Ok(op) = requests.recv() {
            match op {
                Op::Post {
                    link,
                    minibatch,
                    tensor,
                } => {
                    let header = Header::Tensor {
                        dtype: tensor.dtype(),
                        shape: tensor.shape().to_vec(),
                        minibatch,
                        memory: MemoryKind::Host,
                    };
                    self.queue(link, header, Body::Tensor(tensor));
                }
                Op::PostAck { link, minibatch } => {
                    self.queue(link, Header::Ack { minibatch }, Body::None);
                }
                Op::Fetch { link } => self.fetch(link, false),
                Op::FetchAck { link } => self.fetch(link, true),
                Op::Flush { reply } => {
                    let _ = reply.send(self.drain());
                }
                Op::Abort { reason } => self.abort(&reason),
                Op::Finish => self.done = true,
            }
        }
        if !self.done {
            let reason = self.core.abort_reason();
            self.abort(&reason);
        }
    }

    fn queue(&mut self, link: usize, header: Header, body: Body) {
        if let Some(handed) = self.handed.get_mut(link) {
            *handed += 1;
        }
        let state = &self.core.links[link];
        self.pending.push(Outgoing {
            link,
            peer: state.link.peer,
            tag: state.link.tag,
            header: header.encode(),
            body,
        });
    }

    /// Receives the next tensor (or ack) of `link`, sending what is queued
    /// in the same transaction.
    fn fetch(&mut self, link: usize, ack: bool) {
        let state: &LinkState = &self.core.links[link];
        let counts = state.counts();
        let due = state
            .link
            .nth(if ack { counts.acked } else { counts.arrived });
        match self.receive(&state.link, due, ack) {
            Ok(None) => state.acknowledge(),
            Ok(Some((minibatch, tensor))) => state.deliver(minibatch, Payload::Host(tensor)),
            Err(e) => state.fail(e),
        }
    }

    fn receive(
        &mut self,
        link: &Link,
        due: Option<u64>,
        ack: bool,
    ) -> Result<Option<(u64, Tensor)>, PipelineError> {
        if let Some(err) = &self.broken {
            return Err(err.clone());
        }
        let mut bytes = [0u8; HEADER_LEN];
        let result = self.exchange(Some((&mut bytes, link.peer, link.tag)));
        result.map_err(|e| self.break_with(transport_error(link, due, e)))?;
        let header = Header::decode(&bytes).map_err(|m| protocol(link, m))?;
        match header {
            Header::Ack { minibatch } if ack && Some(minibatch) == due => Ok(None),
            Header::Abort { reason_len } => {
                let mut reason = vec![0u8; reason_len];
                self.recv_plain(link, due, &mut reason)?;
                Err(aborted(link, due, &reason))
            }
            other if ack => Err(protocol(
                link,
                format!("expected the ack of minibatch {due:?}, got {other:?}"),
            )),
            other => {
                let (dtype, shape, memory) = expect_tensor(link, due, other)?;
                if memory != MemoryKind::Host {
                    return Err(protocol(
                        link,
                        "a device tensor arrived on the serial engine, which moves host \
                         tensors only"
                            .into(),
                    ));
                }
                let mut data = vec![0u8; byte_len(&shape, dtype)];
                self.recv_plain(link, due, &mut data)?;
                let tensor = Tensor::from_bytes(dtype, shape, &data).map_err(|source| {
                    PipelineError::Tensor {
                        name: link.name.clone(),
                        source,
                    }
                })?;
                Ok(Some((due.unwrap_or(0), tensor)))
            }
        }
    }

    fn recv_plain(
        &mut self,
        link: &Link,
        due: Option<u64>,
        buf: &mut [u8],
    ) -> Result<(), PipelineError> {
        self.comm
            .recv(buf, link.peer, link.tag)
            .map_err(|e| self.break_with(transport_error(link, due, e)))
    }

    fn break_with(&mut self, error: PipelineError) -> PipelineError {
        self.broken.get_or_insert_with(|| error.clone());
        error
    }

    /// Sends everything queued, in order, then receives `recv` if given.
    fn exchange(&mut self, recv: Option<(&mut [u8], usize, u32)>) -> Result<(), TransportError> {
        for out in std::mem::take(&mut self.pending) {
            self.comm.send(&out.header, out.peer, out.tag)?;
            if let Some(body) = out.body.bytes() {
                self.comm.send(body, out.peer, out.tag)?;
            }
        }
        match recv {
            Some((buf, peer, tag)) => self.comm.recv(buf, peer, tag),
            None => Ok(()),
        }
    }

    /// Receives the acks still due (so that none is left behind on the
    /// communicator when the run ends), then sends everything queued.
    fn drain(&mut self) -> Result<(), PipelineError> {
        for (i, state) in self.core.links.iter().enumerate() {
            if !(state.link.acked && state.link.role == Role::Send) {
                continue;
            }
            while state.counts().acked < state.link.expected {
                if let Some(err) = state.failure() {
                    return Err(err);
                }
                self.fetch(i, true);
            }
        }
        self.flush()
    }

    /// Sends everything queued.
    fn flush(&mut self) -> Result<(), PipelineError> {
        if let Some(err) = &self.broken {
            return Err(err.clone());
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        let result = self.exchange(None);
        result.map_err(|source| self.break_with(PipelineError::Flush { source }))
    }

    /// Replaces what is queued by an abort on every link that still owes
    /// its peer a message (queued tensors are dropped: a peer that is
    /// failing too might never receive them, and a send that waits for its
    /// receiver would then never end).
    fn abort(&mut self, reason: &str) {
        if self.done {
            return;
        }
        self.done = true;
        for dropped in self.pending.drain(..) {
            if let Some(handed) = self.handed.get_mut(dropped.link) {
                *handed -= 1;
            }
        }
        let reason = reason_bytes(reason);
        for (i, state) in self.core.links.iter().enumerate() {
            let link = &state.link;
            let owes = link.role == Role::Send || link.acked;
            if owes && self.handed[i] < link.expected {
                self.pending.push(Outgoing {
                    link: i,
                    peer: link.peer,
                    tag: link.tag,
                    header: Header::Abort {
                        reason_len: reason.len(),
                    }
                    .encode(),
                    body: Body::Bytes(reason.clone()),
                });
            }
        }
        let _ = self.flush();
    }
}
