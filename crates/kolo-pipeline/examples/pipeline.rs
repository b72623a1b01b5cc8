//! A 3-layer MLP trained by a 3-stage pipeline of widths 1, 2, 1 on the
//! kolo-threads backend (4 ranks), one layer per stage, with a 1F1B
//! schedule — and checked bit for bit against the same training done
//! sequentially in one thread.
//!
//! Stage 0 (rank 0) reads the data and runs layer 1; stage 1 (ranks 1 and
//! 2) runs layer 2, its two replicas taking alternate minibatches and
//! summing their gradients with an allreduce of their own; stage 2 (rank 3)
//! runs layer 3 and the softmax cross-entropy loss. The labels (i64) go
//! from stage 0 straight to stage 2. Every optimizer step runs `MICRO`
//! minibatches through the pipeline in 1F1B order and then flushes it
//! (PipeDream-Flush): the update uses the gradients of exactly those
//! minibatches, as sequential training with gradient accumulation does.
//!
//! Why bitwise: each stage computes exactly the float operations the
//! sequential run computes, in the same order — gradients accumulate over
//! a replica's minibatches in minibatch order, and the sequential run keeps
//! layer 2's gradients in two accumulators (even and odd minibatches) added
//! once at the end, which is what the two replicas' allreduce computes
//! (a sum of two numbers does not depend on their order).
//!
//! Run with `cargo run -p kolo-pipeline --example pipeline`: the four
//! ranks as threads. Started as four processes by `kolo-run` (or any
//! launcher that sets torchrun's variables), each process is one rank,
//! its channels UCX connections made through kolo-rendezvous, and each
//! checks its own stage against the sequential run:
//!
//! ```text
//! cargo build -p kolo-pipeline --example pipeline
//! cargo run -p kolo-run -- -n 4 target/debug/examples/pipeline
//! ```

use kolo_pipeline::schedule::{local_minibatches, one_f_one_b, Pass};
use kolo_pipeline::{
    channels, pair_channels, ChannelKey, Direction, Endpoint, Options, Pipeline, PipelineError,
    PipelineSpec, StagePlan, Tensor, TensorSpec,
};
use kolo_protocol::{DataType, ReduceOp};
use kolo_rendezvous::Rendezvous;
use kolo_threads::{Collectives, Topology};
use kolo_transport::Scale;
use kolo_ucx::UcxComm;
use std::collections::HashMap;
use std::error::Error;
use std::sync::Mutex;
use std::time::Instant;

const INPUT: usize = 16;
const HIDDEN: usize = 64;
const CLASSES: usize = 4;
const BATCH: usize = 16;
const MICRO: u64 = 8;
const STEPS: u64 = 40;
const LR: f32 = 0.2;

type Result<T, E = Box<dyn Error + Send + Sync>> = std::result::Result<T, E>;

/// A dense layer `y = x Wᵀ + b` over a batch of rows.
#[derive(Clone, Debug, PartialEq)]
struct Dense {
    inputs: usize,
    outputs: usize,
    w: Vec<f32>,
    b: Vec<f32>,
}

/// Gradients of one [`Dense`].
#[derive(Clone, Debug, Default)]
struct Grads {
    w: Vec<f32>,
    b: Vec<f32>,
}

impl Dense {
    fn new(inputs: usize, outputs: usize, seed: u64) -> Self {
        let mut rng = Rng(seed);
        let scale = (2.0 / inputs as f32).sqrt();
        Dense {
            inputs,
            outputs,
            w: (0..inputs * outputs)
                .map(|_| rng.uniform() * scale)
                .collect(),
            b: vec![0.0; outputs],
        }
    }

    fn zero_grads(&self) -> Grads {
        Grads {
            w: vec![0.0; self.w.len()],
            b: vec![0.0; self.b.len()],
        }
    }

    fn forward(&self, x: &[f32], relu: bool) -> Vec<f32> {
        let rows = x.len() / self.inputs;
        let mut y = vec![0.0; rows * self.outputs];
        for n in 0..rows {
            let xn = &x[n * self.inputs..(n + 1) * self.inputs];
            for o in 0..self.outputs {
                let wo = &self.w[o * self.inputs..(o + 1) * self.inputs];
                let z = self.b[o] + wo.iter().zip(xn).map(|(w, x)| w * x).sum::<f32>();
                y[n * self.outputs + o] = if relu { z.max(0.0) } else { z };
            }
        }
        y
    }

    /// Accumulates the gradients of `dy` (already through the activation)
    /// into `grads` and returns the gradient of the input.
    fn backward(&self, x: &[f32], dy: &[f32], grads: &mut Grads) -> Vec<f32> {
        let rows = x.len() / self.inputs;
        let mut dx = vec![0.0; x.len()];
        for n in 0..rows {
            let xn = &x[n * self.inputs..(n + 1) * self.inputs];
            for o in 0..self.outputs {
                let d = dy[n * self.outputs + o];
                grads.b[o] += d;
                for i in 0..self.inputs {
                    grads.w[o * self.inputs + i] += d * xn[i];
                    dx[n * self.inputs + i] += d * self.w[o * self.inputs + i];
                }
            }
        }
        dx
    }

    /// One SGD step with the mean gradient over `MICRO` minibatches.
    fn step(&mut self, grads: &Grads) {
        let factor = LR / MICRO as f32;
        for (w, g) in self.w.iter_mut().zip(&grads.w) {
            *w -= factor * g;
        }
        for (b, g) in self.b.iter_mut().zip(&grads.b) {
            *b -= factor * g;
        }
    }
}

/// `dy * (y > 0)`: the gradient through a ReLU whose output was `y`.
fn through_relu(y: &[f32], dy: &[f32]) -> Vec<f32> {
    y.iter()
        .zip(dy)
        .map(|(&y, &d)| if y > 0.0 { d } else { 0.0 })
        .collect()
}

/// Mean softmax cross-entropy of `logits` against `labels`, and its
/// gradient.
fn loss_and_grad(logits: &[f32], labels: &[i64]) -> (f32, Vec<f32>) {
    let mut loss = 0.0;
    let mut grad = vec![0.0; logits.len()];
    for (n, &label) in labels.iter().enumerate() {
        let row = &logits[n * CLASSES..(n + 1) * CLASSES];
        let max = row.iter().fold(f32::MIN, |m, &v| m.max(v));
        let exps: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        let label = label as usize;
        loss -= (exps[label] / sum).ln();
        for c in 0..CLASSES {
            let p = exps[c] / sum - if c == label { 1.0 } else { 0.0 };
            grad[n * CLASSES + c] = p / labels.len() as f32;
        }
    }
    (loss / labels.len() as f32, grad)
}

/// xorshift64*: reproducible data without a dependency.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        bits as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Minibatch `g`: inputs, and labels from a fixed random teacher.
fn data(g: u64) -> (Vec<f32>, Vec<i64>) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (g + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let x: Vec<f32> = (0..BATCH * INPUT).map(|_| rng.uniform()).collect();
    let labels = x
        .chunks(INPUT)
        .map(|row| {
            let score = |c: usize| row.iter().skip(c).step_by(CLASSES).sum::<f32>();
            (0..CLASSES)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap_or(0) as i64
        })
        .collect();
    (x, labels)
}

fn model() -> [Dense; 3] {
    [
        Dense::new(INPUT, HIDDEN, 1),
        Dense::new(HIDDEN, HIDDEN, 2),
        Dense::new(HIDDEN, CLASSES, 3),
    ]
}

/// The reference: the same training, one minibatch after the other.
fn sequential() -> ([Dense; 3], Vec<f32>) {
    let [mut l1, mut l2, mut l3] = model();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (mut g1, mut g3) = (l1.zero_grads(), l3.zero_grads());
        let mut g2 = [l2.zero_grads(), l2.zero_grads()];
        let mut loss = 0.0;
        for g in step * MICRO..(step + 1) * MICRO {
            let (x, labels) = data(g);
            let h1 = l1.forward(&x, true);
            let h2 = l2.forward(&h1, true);
            let logits = l3.forward(&h2, false);
            let (l, dlogits) = loss_and_grad(&logits, &labels);
            loss += l / MICRO as f32;
            let dh2 = l3.backward(&h2, &dlogits, &mut g3);
            let dh1 = l2.backward(&h1, &through_relu(&h2, &dh2), &mut g2[(g % 2) as usize]);
            l1.backward(&x, &through_relu(&h1, &dh1), &mut g1);
        }
        let [even, odd] = g2;
        let sum = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x + y).collect();
        let g2 = Grads {
            w: sum(&even.w, &odd.w),
            b: sum(&even.b, &odd.b),
        };
        l1.step(&g1);
        l2.step(&g2);
        l3.step(&g3);
        losses.push(loss);
    }
    ([l1, l2, l3], losses)
}

/// What one rank of the pipeline ends with.
struct RankResult {
    layer: Dense,
    losses: Vec<f32>,
    minibatches: u64,
    seconds: f64,
}

fn f32_tensor(rows: usize, data: Vec<f32>) -> Result<Tensor> {
    let cols = data.len() / rows;
    Ok(Tensor::new([rows, cols], data)?)
}

/// Takes what a slot holds, once.
fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().ok().and_then(|mut s| s.take())
}

/// One rank's part of the pipelined training.
/// Sums a replicated stage's gradients over its replicas, in place.
type SumReplicas<'a> = dyn FnMut(&mut [f32]) -> Result<()> + 'a;

/// `sum_replicas` sums a replicated stage's gradients over its replicas
/// (`None` on a stage of one replica).
fn train_stage(pipe: &Pipeline, sum_replicas: Option<&mut SumReplicas<'_>>) -> Result<RankResult> {
    let plan = pipe.plan();
    let (stage, replica) = (plan.stage(), plan.replica());
    let mut layer = model()[stage].clone();
    let (fwd, bwd) = (Direction::Forward, Direction::Backward);
    let mut losses = Vec::new();
    let mut stash: HashMap<u64, (Vec<f32>, Vec<f32>)> = HashMap::new();
    let started = Instant::now();
    let mut minibatches = 0;
    let mut sum_replicas = sum_replicas;
    for step in 0..STEPS {
        let mine: Vec<u64> = local_minibatches((step + 1) * MICRO, replica)
            .filter(|&g| g >= step * MICRO)
            .collect();
        minibatches += mine.len() as u64;
        let mut grads = layer.zero_grads();
        let mut loss = 0.0;
        for pass in one_f_one_b(stage, plan.num_stages(), &mine) {
            match (stage, pass) {
                (0, Pass::Forward(g)) => {
                    let (x, labels) = data(g);
                    let h1 = layer.forward(&x, true);
                    pipe.send("h1", f32_tensor(BATCH, h1.clone())?, g, fwd)?;
                    pipe.send("labels", Tensor::new([BATCH], labels)?, g, fwd)?;
                    stash.insert(g, (x, h1));
                }
                (0, Pass::Backward(g)) => {
                    let dh1 = pipe.recv("h1", g, bwd)?.into_vec::<f32>()?;
                    let (x, h1) = stash.remove(&g).ok_or("no stash")?;
                    layer.backward(&x, &through_relu(&h1, &dh1), &mut grads);
                }
                (1, Pass::Forward(g)) => {
                    let h1 = pipe.recv("h1", g, fwd)?.into_vec::<f32>()?;
                    let h2 = layer.forward(&h1, true);
                    pipe.send("h2", f32_tensor(BATCH, h2.clone())?, g, fwd)?;
                    stash.insert(g, (h1, h2));
                }
                (1, Pass::Backward(g)) => {
                    let dh2 = pipe.recv("h2", g, bwd)?.into_vec::<f32>()?;
                    let (h1, h2) = stash.remove(&g).ok_or("no stash")?;
                    let dh1 = layer.backward(&h1, &through_relu(&h2, &dh2), &mut grads);
                    pipe.send("h1", f32_tensor(BATCH, dh1)?, g, bwd)?;
                }
                (_, Pass::Forward(g)) => {
                    let h2 = pipe.recv("h2", g, fwd)?.into_vec::<f32>()?;
                    let labels = pipe.recv("labels", g, fwd)?.into_vec::<i64>()?;
                    let (l, dlogits) = loss_and_grad(&layer.forward(&h2, false), &labels);
                    loss += l / MICRO as f32;
                    stash.insert(g, (h2, dlogits));
                }
                (_, Pass::Backward(g)) => {
                    let (h2, dlogits) = stash.remove(&g).ok_or("no stash")?;
                    let dh2 = layer.backward(&h2, &dlogits, &mut grads);
                    pipe.send("h2", f32_tensor(BATCH, dh2)?, g, bwd)?;
                }
            }
        }
        // The flush: a replicated stage sums its replicas' gradients.
        if let Some(sum) = sum_replicas.as_deref_mut() {
            sum(&mut grads.w)?;
            sum(&mut grads.b)?;
        }
        layer.step(&grads);
        losses.push(loss);
    }
    Ok(RankResult {
        layer,
        losses,
        minibatches,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The pipeline: three stages of widths 1, 2, 1 and the tensors between
/// them.
fn spec() -> PipelineSpec {
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
        .tensor(
            TensorSpec::new("labels", DataType::I64, 3)
                .from_stage(0)
                .to_stage(2)
                .without_gradient(),
        )
}

/// The four ranks as threads of this process (kolo-threads).
fn pipelined() -> Result<Vec<RankResult>> {
    let spec = spec();
    let options = Options::training(STEPS * MICRO);
    let channels = pair_channels(&spec, &options, |_| {
        let mut comms =
            kolo_threads::communicators(2).map_err(|e| PipelineError::Start(e.to_string()))?;
        let receiver = comms.pop();
        comms
            .pop()
            .zip(receiver)
            .ok_or_else(|| PipelineError::Start("no communicators".into()))
    })?;
    let channels: Vec<_> = channels.into_iter().map(|c| Mutex::new(Some(c))).collect();
    // Stage 1's replicas (ranks 1 and 2) sum their gradients among themselves.
    let group: Vec<_> = kolo_threads::communicators(2)?
        .into_iter()
        .map(|c| Mutex::new(Some(c)))
        .collect();
    Ok(kolo_threads::run(4, |comm| -> Result<RankResult> {
        let rank = comm.rank();
        let ends = take(&channels[rank]).ok_or("channels already taken")?;
        let pipe = Pipeline::start(StagePlan::new(&spec, rank)?, options, ends)?;
        let mut stage_group = match rank {
            1 | 2 => Some(take(&group[rank - 1]).ok_or("group already taken")?),
            _ => None,
        };
        let mut sum = |grads: &mut [f32]| -> Result<()> {
            let comm = stage_group.as_mut().ok_or("no stage group")?;
            Ok(comm.allreduce(grads, ReduceOp::Sum, Scale::NONE)?)
        };
        let replicated = matches!(rank, 1 | 2);
        let result = train_stage(&pipe, replicated.then_some(&mut sum as _))?;
        pipe.finish()?;
        Ok(result)
    })?)
}

/// This process's rank of a job of four processes (kolo-run, torchrun's
/// variables): channels as two-rank UCX communicators made through the
/// rendezvous, stage 1's replicas summing their gradients over one of
/// their own; checks its own stage against the sequential run.
fn one_process() -> Result<()> {
    let mut rendezvous = Rendezvous::from_env()?;
    let rank = rendezvous.rank();
    let spec = spec();
    let options = Options::training(STEPS * MICRO);
    let plan = StagePlan::new(&spec, rank)?;
    // One two-rank communicator per channel, made by every rank in the
    // order of the pipeline's list; this rank keeps those it is on.
    let mut ends = HashMap::new();
    for key in channels(&spec, &options)? {
        if let Some(comm) = UcxComm::connect_ranks(&mut rendezvous, &[key.sender, key.receiver])? {
            let peer = usize::from(comm.rank() == 0);
            ends.insert(key, Endpoint { comm, peer });
        }
    }
    let mut replicas = UcxComm::connect_ranks(&mut rendezvous, &[1, 2])?;
    rendezvous.close()?;
    let ends = move |key: &ChannelKey| {
        ends.remove(key)
            .ok_or_else(|| PipelineError::Start(format!("rank {rank} has no end of {key}")))
    };
    let pipe = Pipeline::start(plan, options, ends)?;
    let mut sum = |grads: &mut [f32]| -> Result<()> {
        let comm = replicas.as_mut().ok_or("not a replica of stage 1")?;
        Ok(comm.allreduce(grads, ReduceOp::Sum, Scale::NONE)?)
    };
    let replicated = matches!(rank, 1 | 2);
    let result = train_stage(&pipe, replicated.then_some(&mut sum as _))?;
    pipe.finish()?;
    let (reference, reference_losses) = sequential();
    let want = &reference[[0, 1, 1, 2][rank]];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert_eq!(
        bits(&result.layer.w),
        bits(&want.w),
        "rank {rank}: weights differ"
    );
    assert_eq!(
        bits(&result.layer.b),
        bits(&want.b),
        "rank {rank}: biases differ"
    );
    if rank == 3 {
        assert_eq!(
            bits(&result.losses),
            bits(&reference_losses),
            "losses differ"
        );
    }
    println!(
        "rank {rank}: {} minibatches in {:.3} s; parameters{} equal the sequential run's bit for bit",
        result.minibatches,
        result.seconds,
        if rank == 3 { " and losses" } else { "" }
    );
    Ok(())
}

fn main() -> Result<()> {
    if std::env::var_os("MASTER_ADDR").is_some() && std::env::var_os("RANK").is_some() {
        return one_process();
    }
    let started = Instant::now();
    let (reference, reference_losses) = sequential();
    let sequential_seconds = started.elapsed().as_secs_f64();
    let ranks = pipelined()?;

    let total = STEPS * MICRO;
    println!("{total} minibatches of {BATCH}, {STEPS} steps of {MICRO}, 3-layer MLP, stages of widths 1, 2, 1");
    println!(
        "sequential: {:.0} minibatches/s",
        total as f64 / sequential_seconds
    );
    for (stage, ranks_of_stage) in [(0, &ranks[0..1]), (1, &ranks[1..3]), (2, &ranks[3..4])] {
        let done: u64 = ranks_of_stage.iter().map(|r| r.minibatches).sum();
        let seconds = ranks_of_stage.iter().map(|r| r.seconds).fold(0.0, f64::max);
        println!(
            "stage {stage} ({} replica(s)): {done} minibatches in {seconds:.3} s = {:.0} minibatches/s",
            ranks_of_stage.len(),
            done as f64 / seconds
        );
    }
    let losses = &ranks[3].losses;
    println!(
        "loss: {:.4} after the first step, {:.4} after the last",
        losses[0],
        losses[losses.len() - 1]
    );

    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let layers = [&ranks[0].layer, &ranks[1].layer, &ranks[3].layer];
    for (i, (got, want)) in layers.iter().zip(&reference).enumerate() {
        assert_eq!(
            bits(&got.w),
            bits(&want.w),
            "layer {} weights differ",
            i + 1
        );
        assert_eq!(bits(&got.b), bits(&want.b), "layer {} biases differ", i + 1);
    }
    assert_eq!(
        ranks[1].layer, ranks[2].layer,
        "stage 1's replicas diverged"
    );
    assert_eq!(bits(losses), bits(&reference_losses), "losses differ");
    println!("parameters and losses equal the sequential run's bit for bit");
    Ok(())
}
