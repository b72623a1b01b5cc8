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
//! with [`pair_channels`]; a multi-process backend duplicates its world
//! communicator once per entry of [`crate::channels`], on every rank in
//! that order.

use crate::error::PipelineError;
use crate::options::Options;
use crate::plan::channels;
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
/// `FnMut(&ChannelKey) -> Result<Endpoint<B>, PipelineError>` is a factory.
pub trait ChannelFactory {
    /// The communicator type.
    type Comm: Collectives + Send + 'static;

    /// This rank's end of `key`.
    fn open(&mut self, key: &ChannelKey) -> Result<Endpoint<Self::Comm>, PipelineError>;
}

impl<B, F> ChannelFactory for F
where
    B: Collectives + Send + 'static,
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

impl<B: Collectives + Send + 'static> ChannelFactory for ChannelSet<B> {
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
    let mut sets: Vec<ChannelSet<B>> = (0..spec.world_size)
        .map(|rank| ChannelSet {
            rank,
            ends: HashMap::new(),
        })
        .collect();
    for key in keys {
        let (sender, receiver) = make_pair(&key)?;
        for (rank, comm, peer) in [(key.sender, sender, 1), (key.receiver, receiver, 0)] {
            if let Some(set) = sets.get_mut(rank) {
                set.ends.insert(key.clone(), Endpoint { comm, peer });
            }
        }
    }
    Ok(sets)
}
