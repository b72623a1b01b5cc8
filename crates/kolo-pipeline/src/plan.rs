//! [`StagePlan`]: one rank's view of a validated [`PipelineSpec`] — its
//! stage, its replica index, its neighbours, and for each tensor the ranks
//! it receives from and sends to — and the links its helpers serve.

use crate::channels::{ChannelKey, ChannelKind};
use crate::error::PlanError;
use crate::link::{Link, Role};
use crate::options::{Direction, Options};
use crate::schedule::{self, Replica};
use crate::spec::PipelineSpec;
use kolo_protocol::DataType;
use std::collections::HashMap;

/// One tensor as seen from one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRoute {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: DataType,
    /// Its message tag.
    pub tag: u32,
    /// The stage that sends it forward.
    pub producer: usize,
    /// The stage that receives it.
    pub consumer: usize,
    /// Whether its gradient flows back in training.
    pub gradient: bool,
    /// The ranks this rank receives it from, forward (and sends its
    /// gradient back to): the producer stage's replicas whose minibatches
    /// this replica processes. Empty unless this rank is in the consumer
    /// stage.
    pub receive_from: Vec<usize>,
    /// The ranks this rank sends it to, forward (and receives its gradient
    /// from). Empty unless this rank is in the producer stage.
    pub send_to: Vec<usize>,
}

/// One rank's plan: built by every rank from the same [`PipelineSpec`], it
/// says where the rank stands and whom it talks to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagePlan {
    spec: PipelineSpec,
    stage_of: Vec<usize>,
    rank: usize,
    stage: usize,
    index: usize,
    routes: Vec<TensorRoute>,
    by_name: HashMap<String, usize>,
}

impl StagePlan {
    /// Validates `spec` and builds `rank`'s plan.
    pub fn new(spec: &PipelineSpec, rank: usize) -> Result<StagePlan, PlanError> {
        let stage_of = spec.validate()?;
        let Some(&stage) = stage_of.get(rank) else {
            return Err(PlanError::NotInWorld {
                rank,
                world_size: spec.world_size,
            });
        };
        let index = spec.stages[stage]
            .iter()
            .position(|&r| r == rank)
            .unwrap_or(0);
        let me = Replica::new(index, spec.stages[stage].len());
        let mut routes = Vec::with_capacity(spec.tensors.len());
        let mut by_name = HashMap::new();
        for (i, t) in spec.tensors.iter().enumerate() {
            // Validated: both stages are set and in range.
            let (producer, consumer) = (t.producer.unwrap_or(0), t.consumer.unwrap_or(0));
            let connected_ranks = |other: usize, sending: bool| -> Vec<usize> {
                let ranks = &spec.stages[other];
                ranks
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| {
                        let peer = Replica::new(j, ranks.len());
                        if sending {
                            schedule::connected(me, peer)
                        } else {
                            schedule::connected(peer, me)
                        }
                    })
                    .map(|(_, &r)| r)
                    .collect()
            };
            let send_to = if stage == producer {
                connected_ranks(consumer, true)
            } else {
                Vec::new()
            };
            let receive_from = if stage == consumer {
                connected_ranks(producer, false)
            } else {
                Vec::new()
            };
            by_name.insert(t.name.clone(), i);
            routes.push(TensorRoute {
                name: t.name.clone(),
                dtype: t.dtype,
                tag: t.tag,
                producer,
                consumer,
                gradient: t.gradient,
                receive_from,
                send_to,
            });
        }
        Ok(StagePlan {
            spec: spec.clone(),
            stage_of,
            rank,
            stage,
            index,
            routes,
            by_name,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// This rank's stage.
    pub fn stage(&self) -> usize {
        self.stage
    }

    /// This rank's index among its stage's replicas.
    pub fn index_in_stage(&self) -> usize {
        self.index
    }

    /// How many replicas this rank's stage has.
    pub fn stage_width(&self) -> usize {
        self.spec.stages[self.stage].len()
    }

    /// This rank as a replica of its stage.
    pub fn replica(&self) -> Replica {
        Replica::new(self.index, self.stage_width())
    }

    /// The number of stages.
    pub fn num_stages(&self) -> usize {
        self.spec.stages.len()
    }

    /// The ranks of stage `stage` (empty if there is none).
    pub fn stage_ranks(&self, stage: usize) -> &[usize] {
        self.spec.stages.get(stage).map_or(&[], Vec::as_slice)
    }

    /// The stage of `rank`, if it is in the world.
    pub fn stage_of(&self, rank: usize) -> Option<usize> {
        self.stage_of.get(rank).copied()
    }

    /// The ranks of the previous stage (empty for the first stage).
    pub fn previous_stage_ranks(&self) -> &[usize] {
        match self.stage.checked_sub(1) {
            Some(s) => self.stage_ranks(s),
            None => &[],
        }
    }

    /// The ranks of the next stage (empty for the last stage).
    pub fn next_stage_ranks(&self) -> &[usize] {
        self.stage_ranks(self.stage + 1)
    }

    /// Every tensor, in the description's order, with this rank's peers.
    pub fn tensors(&self) -> &[TensorRoute] {
        &self.routes
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorRoute> {
        self.tensor_index(name).map(|i| &self.routes[i])
    }

    pub(crate) fn tensor_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The description this plan was built from.
    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    /// The replica of `stage` that processes `minibatch`, as a rank.
    pub fn rank_for(&self, stage: usize, minibatch: u64) -> Option<usize> {
        let ranks = self.stage_ranks(stage);
        ranks
            .get(schedule::replica_of(minibatch, ranks.len()))
            .copied()
    }

    /// This rank's channels that carry at least one message in a run with
    /// `options`, in the same order as [`channels`].
    pub fn channels(&self, options: &Options) -> Vec<ChannelKey> {
        channels_of(&self.spec, options)
            .into_iter()
            .filter(|c| c.sender == self.rank || c.receiver == self.rank)
            .collect()
    }

    /// This rank's links for a run with `options`, in channel order.
    pub(crate) fn links(&self, options: &Options) -> Vec<Link> {
        let mut links = Vec::new();
        let me = self.replica();
        let training = !options.is_forward_only();
        for (i, route) in self.routes.iter().enumerate() {
            let mut link = |direction, role, peer_stage: usize, j: usize, from, to| {
                let ranks = self.stage_ranks(peer_stage);
                let expected = schedule::link_count(options.iterations, from, to);
                if expected == 0 {
                    return;
                }
                links.push(Link {
                    tensor: i,
                    name: route.name.clone(),
                    dtype: route.dtype,
                    tag: route.tag,
                    direction,
                    role,
                    peer: ranks[j],
                    peer_stage,
                    from,
                    to,
                    expected,
                    acked: !training && direction == Direction::Forward,
                });
            };
            if self.stage == route.producer {
                let width = self.stage_ranks(route.consumer).len();
                for j in 0..width {
                    let peer = Replica::new(j, width);
                    link(Direction::Forward, Role::Send, route.consumer, j, me, peer);
                    if training && route.gradient {
                        link(Direction::Backward, Role::Recv, route.consumer, j, peer, me);
                    }
                }
            }
            if self.stage == route.consumer {
                let width = self.stage_ranks(route.producer).len();
                for j in 0..width {
                    let peer = Replica::new(j, width);
                    link(Direction::Forward, Role::Recv, route.producer, j, peer, me);
                    if training && route.gradient {
                        link(Direction::Backward, Role::Send, route.producer, j, me, peer);
                    }
                }
            }
        }
        links
    }
}

/// Every channel of the pipeline that carries at least one message in a
/// run with `options`, in a fixed order (tensor by tensor, producer replica
/// by producer replica, consumer replica by consumer replica; activations,
/// then gradients or acks). Every rank computes the same list, so a
/// backend whose communicators are created collectively can create one per
/// entry in this order.
pub fn channels(spec: &PipelineSpec, options: &Options) -> Result<Vec<ChannelKey>, PlanError> {
    spec.validate()?;
    options.validate()?;
    Ok(channels_of(spec, options))
}

/// [`channels`] of a validated spec.
fn channels_of(spec: &PipelineSpec, options: &Options) -> Vec<ChannelKey> {
    let mut keys = Vec::new();
    for t in &spec.tensors {
        let (Some(p), Some(c)) = (t.producer, t.consumer) else {
            continue;
        };
        let (Some(producers), Some(consumers)) = (spec.stages.get(p), spec.stages.get(c)) else {
            continue;
        };
        for (a, &sender) in producers.iter().enumerate() {
            for (b, &receiver) in consumers.iter().enumerate() {
                let from = Replica::new(a, producers.len());
                let to = Replica::new(b, consumers.len());
                if schedule::link_count(options.iterations, from, to) == 0 {
                    continue;
                }
                let key = |kind, sender, receiver| ChannelKey {
                    tensor: t.name.clone(),
                    tag: t.tag,
                    kind,
                    sender,
                    receiver,
                };
                keys.push(key(ChannelKind::Activations, sender, receiver));
                if options.is_forward_only() {
                    keys.push(key(ChannelKind::Acks, receiver, sender));
                } else if t.gradient {
                    keys.push(key(ChannelKind::Gradients, receiver, sender));
                }
            }
        }
    }
    keys
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
