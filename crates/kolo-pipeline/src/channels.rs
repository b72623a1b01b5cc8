//! Channels: the one-way message streams of a pipeline, and how a backend
//! provides a communicator for each.
//!
//! The helper threads of [`crate::Pipeline`] each own one communicator for
//! one channel (one tensor, one direction, one pair of ranks), because a
//! backend communicator is `&mut` and not `Sync`: a helper blocked in
//! `recv` from one peer must not stop another helper's `send` to another
//! peer. Every channel is one-way — the sender only sends on it and the
//! receiver only receives (acks go on a channel of their own) — so a
//! helper blocks only on the one peer that feeds its channel, and when a
//! rank goes away every channel it fed reports it.
//!
//! A [`ChannelFactory`] opens this rank's end of a channel. In-process
//! backends (kolo-threads, NCCL in thread mode) build both ends at once
//! with [`pair_channels`]; a multi-process backend (MPI) duplicates its
//! world communicator once per entry of [`crate::channels`], on every rank
//! in that order, with [`duplicate_channels`].

use crate::channel::Channel;
use crate::error::PipelineError;
use crate::options::Options;
use crate::plan::{channels, StagePlan};
use crate::spec::PipelineSpec;
use kolo_transport::Collectives;
use std::collections::HashMap;
use std::fmt;

/// What a channel carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChannelKind {
    /// Activations, producer replica → consumer replica.
    Activations,
    /// Gradients, consumer replica → producer replica.
    Gradients,
    /// Forward-only acks, consumer replica → producer replica.
    Acks,
}

/// One one-way channel, named the same on both ends.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelKey {
    /// The tensor.
    pub tensor: String,
    /// The tensor's tag (every message on the channel carries it).
    pub tag: u32,
    /// What travels.
    pub kind: ChannelKind,
    /// The sending rank (global).
    pub sender: usize,
    /// The receiving rank (global).
    pub receiver: usize,
}

impl fmt::Display for ChannelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} of '{}' from rank {} to rank {}",
            self.kind, self.tensor, self.sender, self.receiver
        )
    }
}

/// This rank's end of a channel: a communicator and the rank, in that
/// communicator, of the other end.
#[derive(Debug)]
pub struct Endpoint<B> {
    /// The communicator, used by one helper thread only.
    pub comm: B,
    /// The other end's rank in `comm`.
    pub peer: usize,
}

/// Opens this rank's end of each of its channels.
///
/// [`crate::Pipeline::start`] calls `open` once for each of
/// [`crate::StagePlan::channels`], in that order. Any
/// `FnMut(&ChannelKey) -> Result<Endpoint<B>, PipelineError>` is a factory
/// (for any [`Channel`] `B`: every `Collectives + Send + 'static`, and
/// NCCL channels).
pub trait ChannelFactory {
    /// The communicator type.
    type Comm: Channel;

    /// This rank's end of `key`.
    fn open(&mut self, key: &ChannelKey) -> Result<Endpoint<Self::Comm>, PipelineError>;
}

impl<B, F> ChannelFactory for F
where
    B: Channel,
    F: FnMut(&ChannelKey) -> Result<Endpoint<B>, PipelineError>,
{
    type Comm = B;

    fn open(&mut self, key: &ChannelKey) -> Result<Endpoint<B>, PipelineError> {
        self(key)
    }
}

/// The channel ends of one rank, built by [`pair_channels`]: a factory
/// that hands each end out once.
#[derive(Debug)]
pub struct ChannelSet<B> {
    rank: usize,
    ends: HashMap<ChannelKey, Endpoint<B>>,
}

impl<B> ChannelSet<B> {
    /// No ends yet, of `rank`.
    pub(crate) fn new(rank: usize) -> Self {
        ChannelSet {
            rank,
            ends: HashMap::new(),
        }
    }

    /// Adds this rank's end of `key`.
    pub(crate) fn insert(&mut self, key: ChannelKey, end: Endpoint<B>) {
        self.ends.insert(key, end);
    }

    /// The rank these ends belong to.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ends are left.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when every end has been handed out.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

impl<B: Channel> ChannelFactory for ChannelSet<B> {
    type Comm = B;

    fn open(&mut self, key: &ChannelKey) -> Result<Endpoint<B>, PipelineError> {
        self.ends.remove(key).ok_or_else(|| {
            PipelineError::Start(format!(
                "rank {} has no end of channel {key} (was the set built from another \
                 description or iteration count, or opened twice?)",
                self.rank
            ))
        })
    }
}

/// Builds both ends of every channel of the pipeline for an in-process
/// backend and deals them out per rank: element `r` is rank `r`'s set.
///
/// `make_pair` returns a two-rank communicator's ranks 0 and 1 for one
/// channel; the sender gets rank 0 and the receiver rank 1. With
/// kolo-threads:
///
/// ```
/// use kolo_pipeline::{pair_channels, Options, PipelineError, PipelineSpec};
///
/// let spec = PipelineSpec::with_widths(&[1, 2]);
/// let sets = pair_channels(&spec, &Options::training(4), |_key| {
///     let mut comms = kolo_threads::communicators(2)
///         .map_err(|e| PipelineError::Start(e.to_string()))?;
///     let receiver = comms.pop();
///     let sender = comms.pop();
///     sender.zip(receiver).ok_or_else(|| PipelineError::Start("no communicators".into()))
/// })?;
/// assert_eq!(sets.len(), 3);
/// # Ok::<(), PipelineError>(())
/// ```
pub fn pair_channels<B, F>(
    spec: &PipelineSpec,
    options: &Options,
    mut make_pair: F,
) -> Result<Vec<ChannelSet<B>>, PipelineError>
where
    F: FnMut(&ChannelKey) -> Result<(B, B), PipelineError>,
{
    let keys = channels(spec, options)?;
    let mut sets: Vec<ChannelSet<B>> = (0..spec.world_size).map(ChannelSet::new).collect();
    for key in keys {
        let (sender, receiver) = make_pair(&key)?;
        for (rank, comm, peer) in [(key.sender, sender, 1), (key.receiver, receiver, 0)] {
            if let Some(set) = sets.get_mut(rank) {
                set.insert(key.clone(), Endpoint { comm, peer });
            }
        }
    }
    Ok(sets)
}

/// Builds this rank's channel ends for a backend whose communicators are
/// duplicated collectively, such as MPI (`MpiComm::duplicate`, an
/// `MPI_Comm_dup`): one duplicate of the world communicator per channel,
/// the peer addressed by its global rank.
///
/// `duplicate` is called once for **every** entry of [`crate::channels`]
/// — the whole pipeline's list, the same on every rank — in that order,
/// also for the channels this rank is not on, because a collective
/// duplicate returns only when every rank of the communicator has called
/// it, as often and in the same order. The duplicates of this rank's
/// channels are kept; the others are dropped at once. So call it on every
/// rank at the same point of the program (with no other collective of the
/// world communicator in between on some ranks only), with the same spec
/// and options. The order of the list and the number of calls depend on
/// the spec and options only: a description invalid on one rank is
/// invalid on all, and is returned before any call.
///
/// Each duplicate must be a communicator of the whole world (the plan's
/// ranks); one that is not is an error naming both. A `duplicate` that
/// fails on some ranks only leaves the others waiting in theirs: for MPI,
/// end the job (`MpiComm::abort`).
///
/// ```no_run
/// use kolo_mpi::MpiComm;
/// use kolo_pipeline::{duplicate_channels, Options, Pipeline, PipelineError, PipelineSpec, StagePlan};
/// use kolo_transport::Topology;
///
/// let comm = MpiComm::init(false)?; // MPI_THREAD_MULTIPLE
/// let spec = PipelineSpec::with_widths(&[1, 2, 1]);
/// let options = Options::training(8);
/// let plan = StagePlan::new(&spec, comm.rank())?;
/// let set = duplicate_channels(&plan, &options, |_key| {
///     comm.duplicate().map_err(|e| PipelineError::Start(e.to_string()))
/// })?;
/// let pipe = Pipeline::start(plan, options, set)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn duplicate_channels<B, F>(
    plan: &StagePlan,
    options: &Options,
    mut duplicate: F,
) -> Result<ChannelSet<B>, PipelineError>
where
    B: Collectives,
    F: FnMut(&ChannelKey) -> Result<B, PipelineError>,
{
    let rank = plan.rank();
    let world = plan.spec().world_size;
    let mut set = ChannelSet::new(rank);
    let mut wrong = None;
    for key in channels(plan.spec(), options)? {
        let comm = duplicate(&key)?;
        let peer = if key.sender == rank {
            key.receiver
        } else if key.receiver == rank {
            key.sender
        } else {
            continue;
        };
        if (comm.rank(), comm.size()) != (rank, world) && wrong.is_none() {
            wrong = Some(PipelineError::Start(format!(
                "the duplicate for channel {key} is rank {} of {}, but the plan is rank \
                 {rank} of {world}: duplicate the world communicator",
                comm.rank(),
                comm.size()
            )));
        }
        set.insert(key, Endpoint { comm, peer });
    }
    match wrong {
        Some(e) => Err(e),
        None => Ok(set),
    }
}

#[cfg(test)]
#[path = "channels_tests.rs"]
mod tests;
