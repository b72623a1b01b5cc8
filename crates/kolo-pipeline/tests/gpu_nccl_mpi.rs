//! kolo-pipeline over NCCL on real GPUs with one process per rank under
//! `mpirun` (`kolo_pipeline::nccl::nccl_mpi_channels`: every channel a
//! two-rank NCCL communicator in process mode, bootstrapped over a pair
//! communicator split off the MPI world), rank r on GPU (local rank %
//! GPUs).
//!
//! `mpirun -np 2 gpu_nccl_mpi` (widths 1, 1): host tensors in training
//! runs of 12 and 7 minibatches, forward only with acks, and of 8 to 24
//! MiB; device tensors (`send_device` / `recv_device`, f32 and i32 GPU to
//! GPU forward and back, up to 8 MiB, see `gpu_device`); and rank 1
//! failing, which rank 0 must report naming it.
//!
//! `mpirun -np 3 gpu_nccl_mpi --widths 1,1,1` (a chain "h1", "h2" with
//! gradients): on 2 GPUs ranks 0 and 2 share GPU 0 but no channel, which
//! works; host tensors training and forward only, and rank 1 failing,
//! which ranks 0 and 2 must name. Then a pipeline with a tensor from
//! stage 0 to stage 2 must be refused on every rank, naming ranks 0 and 2
//! and their GPU (when they share one).
//!
//! Rank 0 prints one `PASS` / `SKIP` / `FAIL` line per check, after every
//! rank's outcome is gathered; every check runs under a watchdog (a hung
//! check is a `FAIL` and ends the job). Without a GPU or NCCL every rank
//! says `skipped` and exits 0. Needs `MPI_THREAD_MULTIPLE`. Sets
//! `NCCL_NVLS_ENABLE=0` unless the environment says otherwise.

mod common;
mod gpu_checks;
mod gpu_device;

use common::{finish_or_abort, run_stage, run_stage_wide, spec_for, totals, TestError};
use gpu_checks::{bounded, print, Outcome};
use kolo_mpi::MpiComm;
use kolo_nccl::{Device, NcclOptions};
use kolo_pipeline::nccl::nccl_mpi_channels;
use kolo_pipeline::{Direction, Options, Pipeline, PipelineSpec, StagePlan, TensorSpec};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Collectives, Controller, Scale, Topology};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The bound on one check, channel set-up included.
const CHECK_TIMEOUT: Duration = Duration::from_secs(75);

/// NCCL operations pending longer fail (a lost peer must not hang).
const OP_TIMEOUT: Duration = Duration::from_secs(45);

/// How long a rank waits for its helper threads after a run.
const HELPERS_TIMEOUT: Duration = Duration::from_secs(30);

/// One rank: its world, GPU, and the device opened before any channel.
struct Rank {
    world: MpiComm,
    gpu: usize,
    device: Device,
}

fn main() -> ExitCode {
    gpu_checks::nvls_off();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let widths: Vec<usize> = kolo_mpi::launcher::flag_value(&args, "--widths")
        .unwrap_or("1,1")
        .split(',')
        .filter_map(|w| w.parse().ok())
        .collect();
    let world = match MpiComm::init(false) {
        Ok(world) => world,
        Err(e) => {
            println!("FAIL MPI init: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (rank, size) = (world.rank(), world.size());
    let gpus = match kolo_nccl::probe::platform() {
        Ok(p) if p.devices > 0 => p.devices,
        Ok(_) => return skipped(rank, "no CUDA device"),
        Err(e) => return skipped(rank, &format!("no CUDA device or NCCL ({e})")),
    };
    let gpu = world.local_rank() % gpus;
    let device = match Device::open(gpu) {
        Ok(device) => device,
        Err(e) => {
            println!("FAIL rank {rank}: opening GPU {gpu}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if rank == 0 {
        println!("{size} processes on {gpus} GPU(s) per host, widths {widths:?}");
    }
    let mut me = Rank { world, gpu, device };
    let failed = match widths.as_slice() {
        [1, 1] => two_stages(&mut me),
        [1, 1, 1] => three_stages(&mut me),
        other => {
            println!("FAIL rank {rank}: widths {other:?}: run with 1,1 or 1,1,1");
            1
        }
    };
    if me.world.barrier().is_err() || failed > 0 {
        if rank == 0 {
            println!("gpu_nccl_mpi: {failed} check(s) FAILED");
        }
        return ExitCode::FAILURE;
    }
    if rank == 0 {
        println!("gpu_nccl_mpi: all checks passed");
    }
    ExitCode::SUCCESS
}

fn skipped(rank: usize, why: &str) -> ExitCode {
    if rank == 0 {
        println!("skipped: {why}");
    }
    ExitCode::SUCCESS
}

/// Widths 1, 1 on 2 processes; returns the number of failed checks.
fn two_stages(me: &mut Rank) -> usize {
    let widths = [1, 1];
    let spec = spec_for(&widths);
    let runs = [
        ("training_12", Options::training(12), 4),
        ("training_7", Options::training(7), 4),
        ("forward_only_9_window_2", Options::forward_only(9, 2), 4),
        ("training_4_8_to_24_MiB", Options::training(4), 2 << 20),
    ];
    let mut failed = 0;
    for (label, options, cols) in runs {
        let want = totals(&widths, options.iterations, options.is_forward_only());
        failed += check(me, &format!("nccl-mpi widths [1, 1] {label}"), |me| {
            host_run(me, &spec, options, cols, want)
        });
    }
    failed += check(
        me,
        "nccl-mpi widths [1, 1] device_tensors_f32_i32_up_to_8_MiB",
        device_run,
    );
    failed += check(me, "nccl-mpi widths [1, 1] failing_stage_is_named", |me| {
        failing_stage(me, &spec, &[0])
    });
    failed
}

/// Widths 1, 1, 1 on 3 processes; returns the number of failed checks.
fn three_stages(me: &mut Rank) -> usize {
    let chain = [1, 2]
        .into_iter()
        .fold(PipelineSpec::with_widths(&[1, 1, 1]), |spec, s| {
            spec.tensor(
                TensorSpec::new(format!("h{s}"), DataType::F32, s as u32)
                    .from_stage(s - 1)
                    .to_stage(s),
            )
        });
    let mut failed = 0;
    for (label, options) in [
        ("training_12", Options::training(12)),
        ("forward_only_9_window_2", Options::forward_only(9, 2)),
    ] {
        let n = options.iterations;
        let want = (2 * n, if options.is_forward_only() { 0 } else { 2 * n });
        let name = format!("nccl-mpi widths [1, 1, 1] chain {label}");
        failed += check(me, &name, |me| host_run(me, &chain, options, 4, want));
    }
    failed += check(
        me,
        "nccl-mpi widths [1, 1, 1] chain failing_stage_is_named",
        |me| failing_stage(me, &chain, &[0, 2]),
    );
    failed += check(
        me,
        "nccl-mpi widths [1, 1, 1] shared_gpu_is_refused",
        shared_gpu_refused,
    );
    failed
}

/// Runs `f` on every rank under the watchdog, gathers every rank's
/// outcome, and prints the check's line on rank 0: failed if any rank
/// failed (each named), skipped if any skipped. Returns 1 for a failure.
fn check(me: &mut Rank, name: &str, f: impl FnOnce(&mut Rank) -> Outcome + Send) -> usize {
    let started = Instant::now();
    let local = bounded(name, CHECK_TIMEOUT, || f(me));
    let (code, text) = match &local {
        Outcome::Pass(note) => (b'P', note),
        Outcome::Skip(why) => (b'S', why),
        Outcome::Fail(why) => (b'F', why),
    };
    let mine: Vec<u8> = std::iter::once(code).chain(text.bytes()).collect();
    let all = match me.world.allgather_bytes(&mine) {
        Ok(all) => all,
        Err(e) => vec![format!("Fgathering the outcomes: {e}").into_bytes()],
    };
    let of = |code: u8| -> Vec<String> {
        all.iter()
            .enumerate()
            .filter(|(_, o)| o.first() == Some(&code))
            .map(|(rank, o)| format!("rank {rank}: {}", String::from_utf8_lossy(&o[1..])))
            .collect()
    };
    let (fails, skips) = (of(b'F'), of(b'S'));
    let outcome = if !fails.is_empty() {
        Outcome::Fail(fails.join("; "))
    } else if !skips.is_empty() {
        Outcome::Skip(skips.join("; "))
    } else {
        local
    };
    if me.world.rank() == 0 {
        print(name, &outcome, started);
    }
    usize::from(matches!(outcome, Outcome::Fail(_)))
}

/// Runs `f` as this rank's stage over NCCL channels opened over the MPI
/// world: finished on `Ok`, aborted with the error otherwise; every helper
/// has ended when this returns (or it is an error).
fn with_pipeline<R>(
    world: &mut MpiComm,
    gpu: usize,
    spec: &PipelineSpec,
    options: Options,
    f: impl FnOnce(&Pipeline) -> Result<R, TestError>,
) -> Result<R, TestError> {
    let plan = StagePlan::new(spec, world.rank())?;
    let nccl = NcclOptions {
        op_timeout: OP_TIMEOUT,
        teardown_timeout: Duration::from_secs(20),
        ..NcclOptions::default()
    };
    let set = nccl_mpi_channels(world, &plan, &options, gpu, &nccl)?;
    let pipe = Pipeline::start(plan, options, set)?;
    let helpers = pipe.helpers();
    let result = finish_or_abort(pipe, f);
    if !helpers.wait_timeout(HELPERS_TIMEOUT) {
        return Err(TestError(format!(
            "{} helper threads still running {HELPERS_TIMEOUT:?} after the run ended ({})",
            helpers.running(),
            result.err().map_or_else(|| "ok".into(), |e| e.0)
        )));
    }
    result
}

/// Every rank runs its stage with host tensors of `cols` columns, checking
/// every tensor it receives; the pipeline's (forward, backward) message
/// totals, summed over the ranks, must be `want`.
fn host_run(
    me: &mut Rank,
    spec: &PipelineSpec,
    options: Options,
    cols: usize,
    want: (u64, u64),
) -> Outcome {
    let report = with_pipeline(&mut me.world, me.gpu, spec, options, |pipe| {
        run_stage_wide(pipe, &(), cols)
    });
    // Every rank takes part in the sum, also one whose run failed.
    let mut sums = report.as_ref().map_or([0, 0], |r| {
        [r.received_forward as i64, r.received_backward as i64]
    });
    let summed = me.world.allreduce(&mut sums, ReduceOp::Sum, Scale::NONE);
    match (report, summed) {
        (Err(e), _) => Outcome::Fail(e.0),
        (_, Err(e)) => Outcome::Fail(format!("summing the totals: {e}")),
        (Ok(_), Ok(())) if sums == [want.0 as i64, want.1 as i64] => Outcome::Pass(format!(
            ": {} forward, {} backward messages",
            want.0, want.1
        )),
        (Ok(_), Ok(())) => Outcome::Fail(format!(
            "the pipeline received {sums:?} messages, expected {want:?}"
        )),
    }
}

/// Device tensors forward and back on widths (1, 1) (see `gpu_device`).
fn device_run(me: &mut Rank) -> Outcome {
    let spec = gpu_device::device_spec();
    let options = Options::training(gpu_device::MINIBATCHES);
    let Rank { world, gpu, device } = me;
    match with_pipeline(world, *gpu, &spec, options, |pipe| {
        gpu_device::device_stage(pipe, device)
    }) {
        Ok(bytes) => Outcome::Pass(gpu_device::device_note(bytes)),
        Err(e) => Outcome::Fail(e.0),
    }
}

/// Rank 1 (stage 1) gives up after its first minibatch: `neighbours`
/// must fail naming it, within the watchdog's bound.
fn failing_stage(me: &mut Rank, spec: &PipelineSpec, neighbours: &[usize]) -> Outcome {
    let rank = me.world.rank();
    let outcome = with_pipeline(&mut me.world, me.gpu, spec, Options::training(12), |pipe| {
        if rank == 1 {
            pipe.recv("h1", 1, Direction::Forward)?;
            return Err(TestError("injected failure on rank 1".into()));
        }
        run_stage(pipe, &())
    });
    let expected = if rank == 1 {
        "injected failure on rank 1"
    } else if neighbours.contains(&rank) {
        "rank 1 (stage 1) failed"
    } else {
        ""
    };
    match outcome {
        Err(e) if e.0.contains(expected) => Outcome::Pass(if rank == 0 {
            format!(": rank 0 saw: {}", e.0)
        } else {
            String::new()
        }),
        Err(e) => Outcome::Fail(format!(
            "expected an error containing '{expected}', got: {}",
            e.0
        )),
        Ok(_) => Outcome::Fail("the run with a failing rank 1 succeeded".into()),
    }
}

/// A tensor from stage 0 to stage 2 puts both ends of its channels on
/// ranks 0 and 2: when they share a GPU (3 processes of one host on 2
/// GPUs), every rank's error must name both ranks and the GPU; otherwise
/// the check is skipped.
fn shared_gpu_refused(me: &mut Rank) -> Outcome {
    let spec = spec_for(&[1, 1, 1]); // "labels" and "skip" go from stage 0 to 2
    let plan = match StagePlan::new(&spec, me.world.rank()) {
        Ok(plan) => plan,
        Err(e) => return Outcome::Fail(e.to_string()),
    };
    let gpus = match me.world.allgather_bytes(&[me.gpu as u8]) {
        Ok(gpus) => gpus,
        Err(e) => return Outcome::Fail(format!("gathering the GPUs: {e}")),
    };
    if me.world.local_size() != 3 || gpus[0] != gpus[2] {
        return Outcome::Skip(format!("ranks 0 and 2 do not share a GPU (GPUs {gpus:?})"));
    }
    let options = Options::training(2);
    let nccl = NcclOptions::default();
    match nccl_mpi_channels(&mut me.world, &plan, &options, me.gpu, &nccl) {
        Err(e) if e.to_string().contains("ranks 0 and 2 both use GPU GPU-") => {
            Outcome::Pass(if me.world.rank() == 0 {
                format!(": {e}")
            } else {
                String::new()
            })
        }
        Err(e) => Outcome::Fail(format!("expected the shared GPU named, got: {e}")),
        Ok(set) => Outcome::Fail(format!("{} channel ends opened on a shared GPU", set.len())),
    }
}
