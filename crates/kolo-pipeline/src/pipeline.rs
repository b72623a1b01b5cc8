//! [`Pipeline`]: the caller's side — `send` and `recv` of named tensors by
//! minibatch and direction, `wait`, `finish` — over either engine: helper
//! threads with a communicator per channel ([`Pipeline::start`]) or one
//! communication loop over a single communicator ([`crate::run_serial`]).

use crate::channels::ChannelFactory;
use crate::error::PipelineError;
use crate::link::Role;
use crate::link_state::{Counter, Helpers, LinkState};
use crate::options::{Direction, Options};
use crate::payload::{check_memory, Payload};
use crate::plan::StagePlan;
use crate::schedule;
use crate::serial::Op;
use crate::tensor::Tensor;
use crate::threaded::Threaded;
use crossbeam_channel::Sender;
use kolo_transport::MemoryKind;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// What both engines share with the caller's side.
pub(crate) struct Core {
    pub(crate) plan: StagePlan,
    pub(crate) options: Options,
    pub(crate) links: Vec<LinkState>,
    index: HashMap<(usize, Direction, usize), usize>,
    pub(crate) helpers: Arc<Counter>,
    /// Why this rank gave up, sent to peers still waiting on it.
    abort_reason: Mutex<Option<String>>,
}

impl Core {
    pub(crate) fn new(plan: StagePlan, options: Options) -> Result<Core, PipelineError> {
        options.validate()?;
        let links: Vec<LinkState> = plan
            .links(&options)
            .into_iter()
            .map(LinkState::new)
            .collect();
        let index = links
            .iter()
            .enumerate()
            .map(|(i, s)| ((s.link.tensor, s.link.direction, s.link.peer), i))
            .collect();
        Ok(Core {
            plan,
            options,
            links,
            index,
            helpers: Arc::default(),
            abort_reason: Mutex::new(None),
        })
    }

    /// The reason given to peers when this rank aborts.
    pub(crate) fn abort_reason(&self) -> String {
        self.abort_reason.lock().clone().unwrap_or_else(|| {
            format!(
                "rank {}'s pipeline was dropped before it finished",
                self.plan.rank()
            )
        })
    }

    fn set_abort_reason(&self, reason: &str) {
        self.abort_reason
            .lock()
            .get_or_insert_with(|| reason.to_string());
    }
}

pub(crate) enum Engine {
    Threaded(Threaded),
    Serial(Sender<Op>),
}

/// One rank's end of a pipeline: sends and receives named tensors by
/// minibatch, in either direction, to and from the right replica of the
/// neighbouring stage (see [`crate::schedule`]).
///
/// `send` hands the tensor over and returns (in forward-only mode it first
/// waits while `window` messages of the link are unacknowledged); `recv`
/// waits for the minibatch's tensor and returns it. Both take `&self`:
/// several threads of a stage may use one pipeline. Call
/// [`Pipeline::finish`] at the end of the run; dropping a pipeline before
/// that aborts it: peers still waiting on this rank fail with
/// [`PipelineError::PeerFailed`] naming it.
pub struct Pipeline {
    pub(crate) core: Arc<Core>,
    pub(crate) engine: Engine,
    finished: bool,
}

impl Pipeline {
    /// Starts the helper threads of `plan`'s rank for a run with `options`:
    /// one per link (tensor, peer, direction) — plus one per link for acks
    /// in forward-only mode — each owning the communicator `factory` opens
    /// for its channel, each moving exactly its link's messages and then
    /// exiting.
    pub fn start<F: ChannelFactory>(
        plan: StagePlan,
        options: Options,
        mut factory: F,
    ) -> Result<Pipeline, PipelineError> {
        let core = Arc::new(Core::new(plan, options)?);
        let threaded = Threaded::spawn(&core, &mut factory)?;
        Ok(Pipeline::with_engine(core, Engine::Threaded(threaded)))
    }

    pub(crate) fn with_engine(core: Arc<Core>, engine: Engine) -> Pipeline {
        Pipeline {
            core,
            engine,
            finished: false,
        }
    }

    /// This rank's plan.
    pub fn plan(&self) -> &StagePlan {
        &self.core.plan
    }

    /// The run's options.
    pub fn options(&self) -> &Options {
        &self.core.options
    }

    /// Sends `tensor` as minibatch `minibatch` of `name` in `direction`:
    /// forward to the consumer stage's replica `minibatch % width`, or
    /// backward (its gradient) to the producer stage's. Sends to one peer
    /// go in minibatch order.
    pub fn send(
        &self,
        name: &str,
        tensor: Tensor,
        minibatch: u64,
        direction: Direction,
    ) -> Result<(), PipelineError> {
        self.send_payload(name, Payload::Host(tensor), minibatch, direction)
    }

    pub(crate) fn send_payload(
        &self,
        name: &str,
        payload: Payload,
        minibatch: u64,
        direction: Direction,
    ) -> Result<(), PipelineError> {
        let i = self.resolve(name, minibatch, direction, Role::Send)?;
        let state = &self.core.links[i];
        check_memory(
            &state.link,
            self.core.plan.rank(),
            payload.memory(),
            self.carrier(i),
        )?;
        let dtype = match &payload {
            Payload::Host(t) => t.dtype(),
            #[cfg(feature = "nccl")]
            Payload::Device(t) => t.dtype(),
        };
        if dtype != state.link.dtype {
            return Err(PipelineError::DType {
                name: name.to_string(),
                direction,
                action: "a send",
                expected: state.link.dtype,
                got: dtype,
            });
        }
        let window = if state.link.acked {
            self.core.options.window()
        } else {
            None
        };
        state.send(
            minibatch,
            window,
            || self.request(Op::FetchAck { link: i }),
            || self.post(i, minibatch, payload),
        )
    }

    /// Receives minibatch `minibatch` of `name` in `direction`: forward from
    /// the producer stage's replica that processed it, or backward (its
    /// gradient) from the consumer stage's. Minibatches may be taken in any
    /// order; each once. A message sent as a device tensor is taken with
    /// `Pipeline::recv_device` (feature `nccl`) instead ([`PipelineError::WrongMemory`]
    /// here, and it stays queued).
    pub fn recv(
        &self,
        name: &str,
        minibatch: u64,
        direction: Direction,
    ) -> Result<Tensor, PipelineError> {
        let (i, payload) = self.recv_payload(name, minibatch, direction, MemoryKind::Host)?;
        payload.into_host(&self.core.links[i].link, minibatch)
    }

    pub(crate) fn recv_payload(
        &self,
        name: &str,
        minibatch: u64,
        direction: Direction,
        wanted: MemoryKind,
    ) -> Result<(usize, Payload), PipelineError> {
        let i = self.resolve(name, minibatch, direction, Role::Recv)?;
        let state = &self.core.links[i];
        check_memory(&state.link, self.core.plan.rank(), wanted, self.carrier(i))?;
        let payload = state.take(minibatch, wanted, || self.request(Op::Fetch { link: i }))?;
        if state.link.acked {
            // The tensor is the caller's either way: an ack that cannot be
            // queued means the link failed, which the link records and
            // `wait` / `finish` report.
            let _ = self.post_ack(i, minibatch);
        }
        Ok((i, payload))
    }

    /// How many helper threads are still moving messages (0 in serial
    /// mode).
    pub fn helpers_running(&self) -> usize {
        self.core.helpers.running()
    }

    /// A handle on this rank's helper threads that outlives the pipeline:
    /// after an abort, wait on it before tearing down a backend they use
    /// (see [`Helpers`]). Serial mode has none (it always reports 0).
    pub fn helpers(&self) -> Helpers {
        Helpers(Arc::clone(&self.core.helpers))
    }

    /// Waits until every message of this rank's links has moved: every
    /// helper has finished its iterations (serial mode: every pending send
    /// is out). This rank must have sent every minibatch it owes (and, in
    /// forward-only mode, taken every one it receives, since those are what
    /// the acks count); otherwise the result is [`PipelineError::Incomplete`]
    /// rather than a wait that cannot end. A link's failure is returned.
    pub fn wait(&self) -> Result<(), PipelineError> {
        self.first_failure()?;
        for state in &self.core.links {
            let (link, counts) = (&state.link, state.counts());
            let short = match link.role {
                Role::Send => (counts.posted < link.expected).then_some((counts.posted, "sent")),
                Role::Recv if link.acked => {
                    (counts.taken < link.expected).then_some((counts.taken, "taken"))
                }
                Role::Recv => None,
            };
            if let Some((done, action)) = short {
                return Err(self.incomplete(state, done, action));
            }
        }
        match &self.engine {
            Engine::Threaded(_) => self.core.helpers.wait(),
            Engine::Serial(ops) => {
                let (reply, answer) = crossbeam_channel::bounded(1);
                ops.send(Op::Flush { reply })
                    .map_err(|_| PipelineError::ShutDown)?;
                answer.recv().map_err(|_| PipelineError::ShutDown)??;
            }
        }
        self.first_failure()
    }

    /// Ends the run: [`Pipeline::wait`], then checks that every message
    /// received was taken. On an error, peers still waiting on this rank are
    /// told it aborted, with the error as reason.
    pub fn finish(mut self) -> Result<(), PipelineError> {
        let result = self.wait().and_then(|()| self.all_taken());
        match &result {
            Ok(()) => self.close(),
            Err(e) => self.abort_with(&e.to_string()),
        }
        result
    }

    /// Gives up: every peer still owed a message from this rank gets an
    /// abort carrying `reason` instead, and fails with
    /// [`PipelineError::PeerFailed`] naming this rank and the reason.
    pub fn abort(mut self, reason: &str) {
        self.abort_with(reason);
    }

    fn abort_with(&mut self, reason: &str) {
        self.finished = true;
        self.core.set_abort_reason(reason);
        match &mut self.engine {
            Engine::Threaded(t) => t.close(),
            Engine::Serial(ops) => {
                let _ = ops.send(Op::Abort {
                    reason: reason.to_string(),
                });
            }
        }
    }

    fn close(&mut self) {
        self.finished = true;
        match &mut self.engine {
            Engine::Threaded(t) => t.join(),
            Engine::Serial(ops) => {
                let _ = ops.send(Op::Finish);
            }
        }
    }

    fn first_failure(&self) -> Result<(), PipelineError> {
        match self.core.links.iter().find_map(LinkState::failure) {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    fn all_taken(&self) -> Result<(), PipelineError> {
        for state in &self.core.links {
            let counts = state.counts();
            if state.link.role == Role::Recv && counts.taken < state.link.expected {
                return Err(self.incomplete(state, counts.taken, "taken"));
            }
        }
        Ok(())
    }

    fn incomplete(&self, state: &LinkState, done: u64, action: &'static str) -> PipelineError {
        PipelineError::Incomplete {
            name: state.link.name.clone(),
            direction: state.link.direction,
            peer: state.link.peer,
            done,
            expected: state.link.expected,
            action,
        }
    }

    /// The link that carries `minibatch` of `name` in `direction` for this
    /// rank acting as `role`, or why there is none.
    pub(crate) fn resolve(
        &self,
        name: &str,
        minibatch: u64,
        direction: Direction,
        role: Role,
    ) -> Result<usize, PipelineError> {
        let plan = &self.core.plan;
        let t = plan
            .tensor_index(name)
            .ok_or_else(|| PipelineError::UnknownTensor {
                name: name.to_string(),
            })?;
        let route = &plan.tensors()[t];
        let action = if role == Role::Send {
            "send"
        } else {
            "receive"
        };
        let wrong = |why: String| PipelineError::WrongStage {
            name: name.to_string(),
            direction,
            action,
            rank: plan.rank(),
            stage: plan.stage(),
            why,
        };
        // Forward: the producer sends, the consumer receives; backward the
        // other way round.
        let producer_side = (direction == Direction::Forward) == (role == Role::Send);
        let (mine, theirs) = if producer_side {
            (route.producer, route.consumer)
        } else {
            (route.consumer, route.producer)
        };
        if plan.stage() != mine {
            let verb = if role == Role::Send {
                "sent"
            } else {
                "received"
            };
            return Err(wrong(format!("it is {verb} {direction} by stage {mine}")));
        }
        if direction == Direction::Backward {
            if self.core.options.is_forward_only() {
                return Err(wrong("the pipeline runs forward-only".into()));
            }
            if !route.gradient {
                return Err(wrong("it has no gradient".into()));
            }
        }
        let iterations = self.core.options.iterations;
        if minibatch >= iterations {
            return Err(PipelineError::MinibatchOutOfRange {
                name: name.to_string(),
                minibatch,
                iterations,
            });
        }
        let owner = schedule::replica_of(minibatch, plan.stage_width());
        if owner != plan.index_in_stage() {
            return Err(PipelineError::NotThisReplica {
                name: name.to_string(),
                minibatch,
                stage: plan.stage(),
                width: plan.stage_width(),
                owner,
                index: plan.index_in_stage(),
            });
        }
        plan.rank_for(theirs, minibatch)
            .and_then(|peer| self.core.index.get(&(t, direction, peer)).copied())
            .ok_or_else(|| wrong(format!("no link carries minibatch {minibatch}")))
    }

    fn post(&self, link: usize, minibatch: u64, payload: Payload) -> Result<(), PipelineError> {
        match (&self.engine, payload) {
            (Engine::Threaded(t), payload) => t.post(&self.core, link, minibatch, payload),
            (Engine::Serial(_), Payload::Host(tensor)) => self.request(Op::Post {
                link,
                minibatch,
                tensor,
            }),
            // `send_device` checked the carrier first; kept for safety.
            #[cfg(feature = "nccl")]
            (Engine::Serial(_), Payload::Device(_)) => check_memory(
                &self.core.links[link].link,
                self.core.plan.rank(),
                MemoryKind::Cuda,
                crate::payload::Carrier::Serial,
            ),
        }
    }

    fn post_ack(&self, link: usize, minibatch: u64) -> Result<(), PipelineError> {
        match &self.engine {
            Engine::Threaded(t) => t.post_ack(&self.core, link, minibatch),
            Engine::Serial(_) => self.request(Op::PostAck { link, minibatch }),
        }
    }

    /// Queues `op` for the serial engine's loop (nothing to do for helper
    /// threads, which fetch on their own).
    fn request(&self, op: Op) -> Result<(), PipelineError> {
        match &self.engine {
            Engine::Threaded(_) => Ok(()),
            Engine::Serial(ops) => ops.send(op).map_err(|_| PipelineError::ShutDown),
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if !self.finished {
            let reason = self.core.abort_reason();
            self.abort_with(&reason);
        }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("rank", &self.core.plan.rank())
            .field("stage", &self.core.plan.stage())
            .field("links", &self.core.links.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_can_be_shared_by_the_threads_of_a_stage() {
        fn shared<T: Send + Sync>() {}
        shared::<Pipeline>();
    }
}
