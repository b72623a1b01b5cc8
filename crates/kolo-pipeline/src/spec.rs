//! The description of a pipeline every rank builds the same way: its
//! stages (lists of ranks) and the tensors that cross them.

use crate::error::PlanError;
use kolo_protocol::DataType;
use kolo_transport::RESERVED_TAG_BASE;
use std::collections::HashMap;

/// A tensor that crosses stages: produced (sent forward) by one stage,
/// consumed (received) by a later one, whose gradient — unless
/// [`TensorSpec::without_gradient`] — flows back the same way.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    /// Its name, unique in the pipeline.
    pub name: String,
    /// Its element type (the gradient has the same).
    pub dtype: DataType,
    /// Its message tag, unique in the pipeline and below
    /// [`kolo_transport::RESERVED_TAG_BASE`].
    pub tag: u32,
    /// The stage that sends it forward.
    pub producer: Option<usize>,
    /// The stage that receives it.
    pub consumer: Option<usize>,
    /// Whether a gradient flows back in training (false for labels).
    pub gradient: bool,
}

impl TensorSpec {
    /// A tensor named `name` of `dtype` with message tag `tag`, with a
    /// gradient and, as yet, no producer or consumer.
    pub fn new(name: impl Into<String>, dtype: DataType, tag: u32) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            tag,
            producer: None,
            consumer: None,
            gradient: true,
        }
    }

    /// Sent forward by `stage`.
    pub fn from_stage(mut self, stage: usize) -> Self {
        self.producer = Some(stage);
        self
    }

    /// Received by `stage`.
    pub fn to_stage(mut self, stage: usize) -> Self {
        self.consumer = Some(stage);
        self
    }

    /// No gradient flows back (inputs such as labels).
    pub fn without_gradient(mut self) -> Self {
        self.gradient = false;
        self
    }
}

/// A pipeline: `world_size` ranks split into stages, and the tensors that
/// cross them. Build it the same way on every rank; [`PipelineSpec::validate`]
/// (called by [`crate::StagePlan::new`]) names the first inconsistency.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineSpec {
    /// Ranks in the world; each must be in exactly one stage.
    pub world_size: usize,
    /// The ranks of each stage, in stage order; a stage's replica `i` is
    /// its `i`-th rank.
    pub stages: Vec<Vec<usize>>,
    /// The tensors, in a fixed order (it orders channels and helpers).
    pub tensors: Vec<TensorSpec>,
}

impl PipelineSpec {
    /// Stages as given, over a world of `world_size` ranks, no tensors yet.
    pub fn new(world_size: usize, stages: Vec<Vec<usize>>) -> Self {
        PipelineSpec {
            world_size,
            stages,
            tensors: Vec::new(),
        }
    }

    /// Stages of the given widths over ranks `0..sum(widths)` in order:
    /// `[1, 2, 1]` is stages `[0]`, `[1, 2]`, `[3]`.
    pub fn with_widths(widths: &[usize]) -> Self {
        let mut next = 0;
        let stages = widths
            .iter()
            .map(|&w| {
                let stage: Vec<usize> = (next..next + w).collect();
                next += w;
                stage
            })
            .collect();
        PipelineSpec::new(next, stages)
    }

    /// Adds a tensor.
    pub fn tensor(mut self, tensor: TensorSpec) -> Self {
        self.tensors.push(tensor);
        self
    }

    /// The stage of every rank, or the first inconsistency: stages first
    /// (empty stage, rank out of range, rank in two stages, rank in no
    /// stage), then tensors in order (empty or duplicate name, reserved or
    /// duplicate tag, missing producer or consumer, stage out of range,
    /// consumer not after producer).
    pub fn validate(&self) -> Result<Vec<usize>, PlanError> {
        let stage_of = self.validate_stages()?;
        self.validate_tensors()?;
        Ok(stage_of)
    }

    fn validate_stages(&self) -> Result<Vec<usize>, PlanError> {
        if self.world_size == 0 {
            return Err(PlanError::NoRanks);
        }
        if self.stages.is_empty() {
            return Err(PlanError::NoStages);
        }
        let mut stage_of: Vec<Option<usize>> = vec![None; self.world_size];
        for (stage, ranks) in self.stages.iter().enumerate() {
            if ranks.is_empty() {
                return Err(PlanError::EmptyStage { stage });
            }
            for &rank in ranks {
                let Some(slot) = stage_of.get_mut(rank) else {
                    return Err(PlanError::RankOutOfRange {
                        rank,
                        stage,
                        world_size: self.world_size,
                    });
                };
                if let Some(first) = *slot {
                    return Err(PlanError::RankInTwoStages {
                        rank,
                        first,
                        second: stage,
                    });
                }
                *slot = Some(stage);
            }
        }
        let covered = stage_of.iter().filter(|s| s.is_some()).count();
        stage_of
            .iter()
            .enumerate()
            .map(|(rank, stage)| {
                stage.ok_or(PlanError::RankInNoStage {
                    rank,
                    world_size: self.world_size,
                    covered,
                })
            })
            .collect()
    }

    fn validate_tensors(&self) -> Result<(), PlanError> {
        let stages = self.stages.len();
        let mut names: HashMap<&str, ()> = HashMap::new();
        let mut tags: HashMap<u32, &str> = HashMap::new();
        for (index, t) in self.tensors.iter().enumerate() {
            if t.name.is_empty() {
                return Err(PlanError::EmptyName { index });
            }
            if names.insert(&t.name, ()).is_some() {
                return Err(PlanError::DuplicateTensor {
                    name: t.name.clone(),
                });
            }
            if t.tag >= RESERVED_TAG_BASE {
                return Err(PlanError::ReservedTag {
                    name: t.name.clone(),
                    tag: t.tag,
                    limit: RESERVED_TAG_BASE,
                });
            }
            if let Some(first) = tags.insert(t.tag, &t.name) {
                return Err(PlanError::DuplicateTag {
                    tag: t.tag,
                    first: first.to_string(),
                    second: t.name.clone(),
                });
            }
            let (producer, consumer) = match (t.producer, t.consumer) {
                (Some(p), Some(c)) => (p, c),
                (Some(producer), None) => {
                    return Err(PlanError::NeverReceived {
                        name: t.name.clone(),
                        producer,
                    })
                }
                (None, Some(consumer)) => {
                    return Err(PlanError::NeverSent {
                        name: t.name.clone(),
                        consumer,
                    })
                }
                (None, None) => {
                    return Err(PlanError::Unrouted {
                        name: t.name.clone(),
                    })
                }
            };
            for stage in [producer, consumer] {
                if stage >= stages {
                    return Err(PlanError::StageOutOfRange {
                        name: t.name.clone(),
                        stage,
                        stages,
                    });
                }
            }
            if consumer <= producer {
                return Err(PlanError::NotForward {
                    name: t.name.clone(),
                    producer,
                    consumer,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three_stages() -> PipelineSpec {
        PipelineSpec::with_widths(&[1, 2, 1])
            .tensor(
                TensorSpec::new("h1", DataType::F32, 1)
                    .from_stage(0)
                    .to_stage(1),
            )
            .tensor(
                TensorSpec::new("h2", DataType::F32, 2)
                    .from_stage(1)
                    .to_stage(2),
            )
    }

    fn err(spec: &PipelineSpec) -> String {
        match spec.validate() {
            Ok(_) => "valid".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_consistent_spec_gives_every_rank_its_stage() {
        assert_eq!(three_stages().validate(), Ok(vec![0, 1, 1, 2]));
    }

    #[test]
    fn inconsistent_stages_are_named() {
        let mut spec = three_stages();
        spec.stages[1] = vec![1, 3];
        assert_eq!(err(&spec), "rank 3 is in stage 1 and again in stage 2");
        spec.stages[1] = vec![1];
        assert_eq!(
            err(&spec),
            "rank 2 is in no stage (4 ranks, stages cover 3)"
        );
        spec.stages[1] = vec![];
        assert_eq!(err(&spec), "stage 1 has no ranks");
        spec.stages[1] = vec![1, 2, 9];
        assert_eq!(
            err(&spec),
            "stage 1 lists rank 9, but the world has only 4 ranks"
        );
        assert_eq!(
            err(&PipelineSpec::new(2, vec![])),
            "the pipeline has no stages"
        );
        assert_eq!(
            err(&PipelineSpec::new(0, vec![])),
            "the pipeline's world has no ranks"
        );
    }

    #[test]
    fn inconsistent_tensors_are_named() {
        let spec = three_stages().tensor(
            TensorSpec::new("h3", DataType::F32, 1)
                .from_stage(1)
                .to_stage(2),
        );
        assert_eq!(
            err(&spec),
            "tag 1 is used by tensor 'h1' and by tensor 'h3'"
        );

        let spec = three_stages().tensor(TensorSpec::new("x", DataType::F32, 9).from_stage(0));
        assert_eq!(
            err(&spec),
            "tensor 'x' is sent by stage 0 but never received (no consumer stage)"
        );
        let spec = three_stages().tensor(TensorSpec::new("x", DataType::F32, 9).to_stage(2));
        assert_eq!(
            err(&spec),
            "tensor 'x' is received by stage 2 but never sent (no producer stage)"
        );
        let spec =
            three_stages().tensor(TensorSpec::new("x", DataType::F32, RESERVED_TAG_BASE + 3));
        assert!(err(&spec).starts_with("tensor 'x' uses tag 4294901763, which is reserved"));
        let spec = three_stages().tensor(TensorSpec::new("h1", DataType::I64, 5));
        assert_eq!(err(&spec), "tensor 'h1' is described twice");
        let spec = three_stages().tensor(
            TensorSpec::new("x", DataType::F32, 9)
                .from_stage(2)
                .to_stage(1),
        );
        assert_eq!(
            err(&spec),
            "tensor 'x' goes from stage 2 to stage 1: activations must flow to a later stage"
        );
        let spec = three_stages().tensor(
            TensorSpec::new("x", DataType::F32, 9)
                .from_stage(0)
                .to_stage(3),
        );
        assert_eq!(
            err(&spec),
            "tensor 'x' names stage 3, but the pipeline has 3 stages"
        );
        let spec = three_stages().tensor(TensorSpec::new("", DataType::F32, 9));
        assert_eq!(err(&spec), "tensor #2 has an empty name");
    }
}
