//! What the threads and the MPI tests share: a pipeline description for
//! stage widths, and one stage's part of a run that checks every tensor it
//! receives (minibatch, shape, dtype, values), forward and backward.

use half::bf16;
use kolo_pipeline::schedule::{local_minibatches, one_f_one_b, Pass};
use kolo_pipeline::{
    Direction, Pipeline, PipelineError, PipelineSpec, PlanError, StagePlan, Tensor, TensorError,
    TensorSpec,
};
use kolo_protocol::DataType;
use std::fmt;

/// A test failure with its reason.
#[derive(Debug)]
pub struct TestError(pub String);

impl fmt::Display for TestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<PipelineError> for TestError {
    fn from(e: PipelineError) -> Self {
        TestError(e.to_string())
    }
}

impl From<PlanError> for TestError {
    fn from(e: PlanError) -> Self {
        TestError(e.to_string())
    }
}

impl From<TensorError> for TestError {
    fn from(e: TensorError) -> Self {
        TestError(e.to_string())
    }
}

/// Stages of `widths` over ranks in order; "h{s}" (f32) goes from stage
/// s-1 to s with a gradient; "labels" (i64, no gradient) from the first to
/// the last stage; with three stages or more, "skip" (bf16) from the first
/// to the last with a gradient.
pub fn spec_for(widths: &[usize]) -> PipelineSpec {
    let last = widths.len() - 1;
    let mut spec = PipelineSpec::with_widths(widths);
    for s in 1..widths.len() {
        spec = spec.tensor(
            TensorSpec::new(format!("h{s}"), DataType::F32, s as u32)
                .from_stage(s - 1)
                .to_stage(s),
        );
    }
    spec = spec.tensor(
        TensorSpec::new("labels", DataType::I64, 100)
            .from_stage(0)
            .to_stage(last)
            .without_gradient(),
    );
    if widths.len() >= 3 {
        spec = spec.tensor(
            TensorSpec::new("skip", DataType::BF16, 101)
                .from_stage(0)
                .to_stage(last),
        );
    }
    spec
}

/// The tensor every side expects for `name`, minibatch `g`, `direction`:
/// shape `[1 + g % 3, cols]` (it changes with the minibatch), values that
/// name all three.
pub fn expected_wide(
    name: &str,
    dtype: DataType,
    g: u64,
    direction: Direction,
    cols: usize,
) -> Result<Tensor, TensorError> {
    let shape = vec![1 + (g % 3) as usize, cols];
    let n = shape[0] * shape[1];
    let seed = name.bytes().map(u64::from).sum::<u64>() * 1000 + g * 10;
    let seed = seed + u64::from(direction == Direction::Backward) * 5;
    match dtype {
        DataType::I64 => Tensor::new(shape, (0..n as i64).map(|i| seed as i64 + i).collect()),
        DataType::BF16 => Tensor::new(
            shape,
            (0..n)
                .map(|i| bf16::from_f32((g * 4 + i as u64 % 64) as f32))
                .collect(),
        ),
        _ => Tensor::new(
            shape,
            (0..n)
                .map(|i| seed as f32 + (i % 1024) as f32 * 0.5)
                .collect(),
        ),
    }
}

/// Runs `f` as this rank's stage on `pipe`: the pipeline is finished when
/// `f` returns `Ok`, and aborted with `f`'s error (its neighbours then fail
/// naming this rank) otherwise.
pub fn finish_or_abort<R>(
    pipe: Pipeline,
    f: impl FnOnce(&Pipeline) -> Result<R, TestError>,
) -> Result<R, TestError> {
    match f(&pipe) {
        Ok(value) => {
            pipe.finish()?;
            Ok(value)
        }
        Err(e) => {
            pipe.abort(&e.0);
            Err(e)
        }
    }
}

/// What one stage did in a run.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub received_forward: u64,
    pub received_backward: u64,
}

/// Sees a stage's sends and forward receives as they complete.
pub trait Observer: Sync {
    /// After `send` of minibatch `g` of `name` (either direction) returned.
    fn sent(&self, _plan: &StagePlan, _name: &str, _g: u64) {}
    /// After a forward `recv` of minibatch `g` of `name` returned.
    fn received(&self, _plan: &StagePlan, _name: &str, _g: u64) {}
}

impl Observer for () {}

/// Runs this rank's stage over `iterations` minibatches in 1F1B order (all
/// forward in forward-only mode), receiving what its stage consumes and
/// sending what it produces; every received tensor is compared with the one
/// sent.
pub fn run_stage(pipe: &Pipeline, observer: &dyn Observer) -> Result<Report, TestError> {
    run_stage_wide(pipe, observer, 4)
}

/// [`run_stage`] with tensors of `cols` columns.
pub fn run_stage_wide(
    pipe: &Pipeline,
    observer: &dyn Observer,
    cols: usize,
) -> Result<Report, TestError> {
    let plan = pipe.plan();
    let options = *pipe.options();
    let stage = plan.stage();
    let mine: Vec<u64> = local_minibatches(options.iterations, plan.replica()).collect();
    let passes = if options.is_forward_only() {
        mine.iter().map(|&g| Pass::Forward(g)).collect()
    } else {
        one_f_one_b(stage, plan.num_stages(), &mine)
    };
    let mut report = Report::default();
    for pass in passes {
        let (g, direction) = match pass {
            Pass::Forward(g) => (g, Direction::Forward),
            Pass::Backward(g) => (g, Direction::Backward),
        };
        let flows = |t: &&kolo_pipeline::TensorRoute| direction == Direction::Forward || t.gradient;
        // Receive everything the pass needs, then send what it makes.
        for t in plan.tensors().iter().filter(flows) {
            let receives = match direction {
                Direction::Forward => t.consumer == stage,
                Direction::Backward => t.producer == stage,
            };
            if !receives {
                continue;
            }
            let got = pipe.recv(&t.name, g, direction)?;
            let want = expected_wide(&t.name, t.dtype, g, direction, cols)?;
            if got != want {
                return Err(TestError(format!(
                    "rank {}: {} {direction} minibatch {g}: got {got:?} starting {:?}, \
                     want {want:?} starting {:?}",
                    plan.rank(),
                    t.name,
                    &got.as_bytes()[..got.as_bytes().len().min(16)],
                    &want.as_bytes()[..want.as_bytes().len().min(16)]
                )));
            }
            match direction {
                Direction::Forward => {
                    report.received_forward += 1;
                    observer.received(plan, &t.name, g);
                }
                Direction::Backward => report.received_backward += 1,
            }
        }
        for t in plan.tensors().iter().filter(flows) {
            let sends = match direction {
                Direction::Forward => t.producer == stage,
                Direction::Backward => t.consumer == stage,
            };
            if sends {
                let tensor = expected_wide(&t.name, t.dtype, g, direction, cols)?;
                pipe.send(&t.name, tensor, g, direction)?;
                observer.sent(plan, &t.name, g);
            }
        }
    }
    Ok(report)
}

/// The forward and backward messages the whole pipeline receives.
pub fn totals(widths: &[usize], iterations: u64, forward_only: bool) -> (u64, u64) {
    let hops = widths.len() as u64 - 1;
    let skip = u64::from(widths.len() >= 3);
    let forward = iterations * (hops + 1 + skip);
    let backward = if forward_only {
        0
    } else {
        iterations * (hops + skip)
    };
    (forward, backward)
}
