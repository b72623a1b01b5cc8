//! Data-parallel SGD with kolo: a 5-layer MLP learns a fixed "teacher"
//! network on synthetic data, one data shard per rank — ranks as threads
//! of this process, or one process per rank under `mpirun`.
//!
//! Each step every rank computes the gradients of its own mini-batch and
//! submits one async allreduce (Average) per parameter tensor — 10 tensors
//! of different sizes — then waits for all of them; the engine negotiates
//! them and fuses them into few collectives. Parameters start different on
//! every rank on purpose and are broadcast from rank 0, so all ranks apply
//! the same averaged gradients to the same parameters and must end
//! bitwise identical, which the example checks (an allgather of every
//! rank's parameter checksum).
//!
//! ```text
//! cargo run --release -p kolo --example train -- --ranks 4 --epochs 8
//! KOLO_TIMELINE=/tmp/kolo.json cargo run --release -p kolo --example train
//!
//! # One process per rank over MPI (see docs/mpi.md for root and
//! # oversubscription flags):
//! cargo build --release -p kolo --features mpi --example train
//! mpirun -np 4 target/release/examples/train --backend mpi
//!
//! # One process per rank over UCX, without MPI: kolo-run (or torchrun)
//! # sets the variables by which the processes meet:
//! cargo build --release -p kolo --features ucx --example train
//! cargo build --release -p kolo-run
//! target/release/kolo-run -n 4 --master-port 0 target/release/examples/train --backend ucx
//! ```
//!
//! Under MPI a rank whose training panics or fails calls `Kolo::abort`,
//! which ends the whole job with `MPI_Abort` and a message naming the rank,
//! instead of leaving its peers waiting for its gradients.
//!
//! On GPUs (`--backend nccl`, one thread per GPU, the `nccl` feature) the
//! gradients, computed as above, are uploaded into persistent device
//! buffers, reduced with one grouped device allreduce (the engine fuses
//! them in its device fusion buffer and NCCL averages them on the GPUs),
//! and downloaded and applied:
//!
//! ```text
//! cargo run --release -p kolo --features nccl --example train -- --backend nccl --ranks 2
//! ```

#[cfg(feature = "nccl")]
#[path = "train/gpu.rs"]
mod gpu;
#[path = "train/grads.rs"]
mod grads;

use grads::{GradReducer, HostReducer};
use kolo::{BackendKind, Kolo, ReduceOp};
use std::time::Instant;

/// Layer widths: input, hidden..., output.
const WIDTHS: [usize; 6] = [16, 64, 48, 32, 16, 1];
const SAMPLES_PER_RANK: usize = 512;
const BATCH: usize = 32;
const LEARNING_RATE: f32 = 0.05;

/// A small deterministic generator (xorshift64*), so no rand crate.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
        bits as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// One dense layer: `out = w x + b`, `w` row-major `outputs x inputs`.
struct Layer {
    w: Vec<f32>,
    b: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

/// A multi-layer perceptron with tanh between layers.
struct Mlp {
    layers: Vec<Layer>,
}

impl Mlp {
    /// Scaled-uniform initialisation from `seed`.
    fn new(seed: u64, gain: f32) -> Mlp {
        let mut rng = Rng::new(seed);
        let layers = WIDTHS
            .windows(2)
            .map(|pair| {
                let (inputs, outputs) = (pair[0], pair[1]);
                let scale = gain / (inputs as f32).sqrt();
                Layer {
                    w: (0..inputs * outputs)
                        .map(|_| rng.uniform() * scale)
                        .collect(),
                    b: (0..outputs).map(|_| rng.uniform() * 0.1).collect(),
                    inputs,
                    outputs,
                }
            })
            .collect();
        Mlp { layers }
    }

    /// Every parameter tensor with its name: w0, b0, w1, b1, ...
    fn tensors_mut(&mut self) -> Vec<(String, &mut Vec<f32>)> {
        let mut out = Vec::new();
        for (l, layer) in self.layers.iter_mut().enumerate() {
            out.push((format!("w{l}"), &mut layer.w));
            out.push((format!("b{l}"), &mut layer.b));
        }
        out
    }

    fn parameter_count(&self) -> usize {
        self.layers.iter().map(|l| l.w.len() + l.b.len()).sum()
    }

    /// The activations of every layer for one sample (input first).
    fn forward(&self, x: &[f32]) -> Vec<Vec<f32>> {
        let mut acts = vec![x.to_vec()];
        for (l, layer) in self.layers.iter().enumerate() {
            let input = &acts[l];
            let mut out = layer.b.clone();
            for (o, value) in out.iter_mut().enumerate() {
                let row = &layer.w[o * layer.inputs..(o + 1) * layer.inputs];
                *value += row.iter().zip(input).map(|(w, x)| w * x).sum::<f32>();
                if l + 1 < self.layers.len() {
                    *value = value.tanh();
                }
            }
            acts.push(out);
        }
        acts
    }

    fn predict(&self, x: &[f32]) -> f32 {
        self.forward(x).last().map_or(0.0, |y| y[0])
    }

    /// Mean squared error over `data`.
    fn loss(&self, data: &[(Vec<f32>, f32)]) -> f32 {
        let total: f32 = data
            .iter()
            .map(|(x, y)| (self.predict(x) - y).powi(2))
            .sum();
        total / data.len() as f32
    }

    /// Gradients of the mean squared error over `batch`, in the order of
    /// [`Mlp::tensors_mut`].
    fn gradients(&self, batch: &[(Vec<f32>, f32)]) -> Vec<Vec<f32>> {
        let mut grads: Vec<Vec<f32>> = self
            .layers
            .iter()
            .flat_map(|l| [vec![0.0; l.w.len()], vec![0.0; l.b.len()]])
            .collect();
        let scale = 2.0 / batch.len() as f32;
        for (x, y) in batch {
            let acts = self.forward(x);
            // d loss / d output of the last layer.
            let mut delta = vec![(acts[acts.len() - 1][0] - y) * scale];
            for (l, layer) in self.layers.iter().enumerate().rev() {
                let input = &acts[l];
                let (gw, gb) = {
                    let (front, back) = grads.split_at_mut(2 * l + 1);
                    (&mut front[2 * l], &mut back[0])
                };
                for (o, &d) in delta.iter().enumerate() {
                    gb[o] += d;
                    for (g, &x) in gw[o * layer.inputs..(o + 1) * layer.inputs]
                        .iter_mut()
                        .zip(input)
                    {
                        *g += d * x;
                    }
                }
                if l > 0 {
                    // Through the weights, then through tanh (input = tanh(z)).
                    delta = (0..layer.inputs)
                        .map(|i| {
                            let back: f32 = (0..layer.outputs)
                                .map(|o| layer.w[o * layer.inputs + i] * delta[o])
                                .sum();
                            back * (1.0 - input[i] * input[i])
                        })
                        .collect();
                }
            }
        }
        grads
    }
}

/// This rank's shard: inputs from a rank-specific seed, targets from the
/// teacher.
fn shard(rank: usize, teacher: &Mlp) -> Vec<(Vec<f32>, f32)> {
    let mut rng = Rng::new(1000 + rank as u64);
    (0..SAMPLES_PER_RANK)
        .map(|_| {
            let x: Vec<f32> = (0..WIDTHS[0]).map(|_| rng.uniform()).collect();
            let y = teacher.predict(&x);
            (x, y)
        })
        .collect()
}

/// One rank's training run; returns its final parameters.
fn train(
    kolo: &Kolo,
    epochs: usize,
    reducer: &mut dyn GradReducer,
) -> Result<Vec<Vec<f32>>, kolo::Error> {
    let rank = kolo.rank();
    let teacher = Mlp::new(7, 2.0);
    let data = shard(rank, &teacher);
    // Different on every rank on purpose: the broadcast makes them equal.
    let mut model = Mlp::new(100 + rank as u64, 1.0);
    for (name, tensor) in model.tensors_mut() {
        kolo.broadcast(&format!("init/{name}"), tensor, 0)?;
    }
    if rank == 0 {
        println!(
            "kolo train: {} ranks, {} layers ({} parameter tensors, {} parameters), {SAMPLES_PER_RANK} samples per rank, batch {BATCH}",
            kolo.size(),
            model.layers.len(),
            2 * model.layers.len(),
            model.parameter_count()
        );
    }

    for epoch in 0..=epochs {
        if epoch > 0 {
            for batch in data.chunks(BATCH) {
                let mut grads = model.gradients(batch);
                let names: Vec<String> = model.tensors_mut().into_iter().map(|(n, _)| n).collect();
                reducer.average(kolo, &names, &mut grads)?;
                for ((_, param), grad) in model.tensors_mut().into_iter().zip(&grads) {
                    for (p, g) in param.iter_mut().zip(grad) {
                        *p -= LEARNING_RATE * g;
                    }
                }
            }
        }
        let mut loss = [model.loss(&data)];
        kolo.allreduce("loss", &mut loss, ReduceOp::Average)?;
        if rank == 0 {
            println!("epoch {epoch:>3}  loss {:.6}", loss[0]);
        }
    }

    // Every rank's checksum of its parameters, compared on every rank.
    let checksum = model
        .tensors_mut()
        .iter()
        .flat_map(|(_, t)| t.iter())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3)
        });
    let all = kolo.allgather("checksum", &[checksum as i64])?;
    if all.iter().any(|&c| c != all[0]) {
        return Err(kolo::Error::InvalidArgument {
            tensor: "checksum".into(),
            reason: format!("the ranks' parameters differ: checksums {all:x?}"),
        });
    }
    if rank == 0 {
        let stats = kolo.stats();
        println!(
            "rank 0: {} collectives carried {} tensors ({} fused, {:.1} tensors per collective on average)",
            stats.operations,
            stats.tensors,
            stats.fused_operations,
            stats.mean_tensors_per_operation()
        );
        let histogram: Vec<String> = stats
            .tensors_per_operation
            .iter()
            .map(|(tensors, ops)| format!("{tensors} tensor(s): {ops}x"))
            .collect();
        println!("tensors per collective: {}", histogram.join(", "));
        println!(
            "cycles: {}, response cache hits: {}",
            stats.cycles, stats.cache_hits
        );
    }
    Ok(model
        .tensors_mut()
        .into_iter()
        .map(|(_, t)| t.clone())
        .collect())
}

/// The command line.
struct Args {
    /// `--backend`, else `KOLO_BACKEND`, else threads.
    backend: Option<BackendKind>,
    /// `--backend nccl`: one thread per GPU, device gradients.
    nccl: bool,
    /// Thread ranks (threads backend: default 4; nccl: GPUs, default 2;
    /// under MPI, `mpirun -np` decides).
    ranks: Option<usize>,
    epochs: usize,
}

const USAGE: &str = "usage: train [--backend threads|mpi|ucx|nccl] [--ranks N] [--epochs E]";

/// `--backend B --ranks N --epochs E`.
fn parse_args() -> Result<Args, String> {
    let mut parsed = Args {
        backend: None,
        nccl: false,
        ranks: None,
        epochs: 8,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number = |name: &str, v: String| -> Result<usize, String> {
            v.parse()
                .map_err(|_| format!("{name}: {v:?} is not a number"))
        };
        match flag.as_str() {
            "--backend" => match value("--backend")?.as_str() {
                "nccl" => parsed.nccl = true,
                v => {
                    parsed.backend = Some(
                        v.parse()
                            .map_err(|e| format!("--backend {v:?}: {e} or nccl"))?,
                    )
                }
            },
            "--ranks" => parsed.ranks = Some(number("--ranks", value("--ranks")?)?),
            "--epochs" => parsed.epochs = number("--epochs", value("--epochs")?)?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown flag {other:?}; {USAGE}")),
        }
    }
    Ok(parsed)
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let config = kolo::Config::from_env()?;
    kolo::init_logging(config.log_level);
    if args.nccl {
        return run_nccl(config, args.ranks.unwrap_or(2), args.epochs);
    }
    match args.backend.unwrap_or(config.backend) {
        BackendKind::Threads => run_threads(config, args.ranks.unwrap_or(4), args.epochs),
        BackendKind::Mpi => run_mpi(config, args.epochs),
        BackendKind::Ucx => run_ucx(config, args.epochs),
    }
}

/// Every rank a thread of this process on its own GPU, gradients reduced
/// on the devices.
#[cfg(feature = "nccl")]
fn run_nccl(
    config: kolo::Config,
    gpus: usize,
    epochs: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let params = kolo::nccl::run(gpus, config, |kolo| {
        let mut reducer = gpu::DeviceReducer::new(kolo)?;
        train(kolo, epochs, &mut reducer)
    })?;
    check_identical(&params)?;
    println!(
        "all {gpus} GPU ranks hold bitwise identical parameters; {:.2} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(not(feature = "nccl"))]
fn run_nccl(
    _config: kolo::Config,
    _gpus: usize,
    _epochs: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    Err("this example was built without NCCL; build it with \
         `cargo run --release -p kolo --features nccl --example train -- --backend nccl`"
        .into())
}

/// Fails unless every rank's parameters are bitwise identical.
fn check_identical(params: &[Vec<Vec<f32>>]) -> Result<(), Box<dyn std::error::Error>> {
    let identical = params.iter().all(|p| {
        p.iter().zip(&params[0]).all(|(a, b)| {
            a.iter()
                .map(|v| v.to_bits())
                .eq(b.iter().map(|v| v.to_bits()))
        })
    });
    if identical {
        Ok(())
    } else {
        Err("the ranks ended with different parameters".into())
    }
}

/// Every rank a thread of this process; checks the parameters directly.
fn run_threads(
    config: kolo::Config,
    ranks: usize,
    epochs: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(path) = &config.timeline {
        println!("writing the timeline to {}", path.display());
    }
    let start = Instant::now();
    let params = kolo::threads::run(ranks, config, |kolo| train(kolo, epochs, &mut HostReducer))?;
    check_identical(&params)?;
    println!(
        "all {ranks} ranks hold bitwise identical parameters; {:.2} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// This process is one rank of an `mpirun` job. A rank that fails (an
/// error or a panic) aborts the whole job naming itself, so that its peers
/// do not wait for it forever.
#[cfg(feature = "mpi")]
fn run_mpi(config: kolo::Config, epochs: usize) -> Result<(), Box<dyn std::error::Error>> {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    let timeline = config.timeline.clone();
    let kolo = Kolo::init_mpi(config)?;
    let rank = kolo.rank();
    if let (Some(path), 0) = (&timeline, rank) {
        println!("writing the timeline to {}", path.display());
    }
    let start = Instant::now();
    let why = match catch_unwind(AssertUnwindSafe(|| train(&kolo, epochs, &mut HostReducer))) {
        // `train` checked that every rank's parameters are identical.
        Ok(Ok(_params)) => {
            kolo.shutdown()?;
            if rank == 0 {
                println!(
                    "all {} ranks (MPI processes) hold bitwise identical parameters; {:.2} s",
                    kolo.size(),
                    start.elapsed().as_secs_f64()
                );
            }
            return Ok(());
        }
        Ok(Err(e)) => format!("rank {rank} failed: {e}"),
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            format!("rank {rank} panicked: {text}")
        }
    };
    // Ends the whole job (MPI_Abort) with this message.
    kolo.abort(&why);
    Err(why.into())
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_config: kolo::Config, _epochs: usize) -> Result<(), Box<dyn std::error::Error>> {
    Err("this example was built without MPI; build it with \
         `cargo build --release -p kolo --features mpi --example train` \
         and run `mpirun -np 4 target/release/examples/train --backend mpi`"
        .into())
}

/// This process is one rank of a job started by kolo-run (or any launcher
/// that sets torchrun's variables), over UCX. A rank that fails returns
/// an error; its peers' collectives then fail naming it, and kolo-run
/// stops the job.
#[cfg(feature = "ucx")]
fn run_ucx(config: kolo::Config, epochs: usize) -> Result<(), Box<dyn std::error::Error>> {
    let kolo = Kolo::init_ucx(config)?;
    let start = Instant::now();
    // `train` checks that every rank's parameters are identical.
    train(&kolo, epochs, &mut HostReducer)?;
    kolo.shutdown()?;
    if kolo.rank() == 0 {
        println!(
            "all {} ranks (UCX processes) hold bitwise identical parameters; {:.2} s",
            kolo.size(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

#[cfg(not(feature = "ucx"))]
fn run_ucx(_config: kolo::Config, _epochs: usize) -> Result<(), Box<dyn std::error::Error>> {
    Err("this example was built without UCX; build it with \
         `cargo build --release -p kolo --features ucx --example train` \
         and run it under kolo-run: `kolo-run -n 4 target/release/examples/train --backend ucx`"
        .into())
}
