//! kolo-pipeline over MPI under a real `mpirun`, one rank per process,
//! with both engines: the serial loop over the process's communicator, and
//! helper threads with a duplicate of it per channel (`duplicate_channels`
//! over `MpiComm::duplicate`, under `MPI_THREAD_MULTIPLE`).
//!
//! `cargo test` runs this binary directly; it re-runs itself under
//! `mpirun -np <ranks>` for each set of stage widths and each engine (see
//! `kolo_mpi::launcher`). Every rank runs training passes (12 minibatches,
//! and 7, which no width > 1 divides), a forward-only pass with acks, and a
//! pass with wider tensors: within OpenMPI's eager limit for the serial
//! engine, which needs it, and of 8 MiB and more for the helper threads,
//! which do not. The message totals are summed over the ranks. With widths
//! 1, 2, 1 a last run makes rank 2 fail and checks that its neighbours
//! fail naming it (through the abort it sends), not hang. With the `nccl`
//! and `mpi` features, two more jobs open NCCL channels over MPI (see
//! `mpi_nccl`).

mod common;
#[cfg(all(feature = "nccl", feature = "mpi"))]
mod mpi_nccl;

use common::{finish_or_abort, run_stage, run_stage_wide, spec_for, totals, TestError};
use kolo_mpi::launcher::{self, Job};
use kolo_mpi::MpiComm;
use kolo_pipeline::{
    duplicate_channels, run_serial, Direction, Options, Pipeline, PipelineError, PipelineSpec,
    StagePlan,
};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Scale, Topology};
use std::process::ExitCode;
use std::time::Duration;

const WIDTHS: [&[usize]; 4] = [&[1, 1], &[1, 2, 1], &[2, 3], &[1, 3, 2, 1]];

/// How long a rank waits for its helper threads after an abort.
const HELPERS_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Serial,
    Threaded,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Serial => "serial",
            Engine::Threaded => "threaded",
        }
    }

    /// The runs: (options, columns of every tensor). The serial engine's
    /// widest tensors (3 x 300 f32, 3.6 KB) stay within OpenMPI's
    /// shared-memory eager limit (4 KB); the helper threads' (1..3 x 2 Mi
    /// f32, 8 to 24 MiB; the i64 labels twice that) are far above it.
    fn runs(self) -> [(Options, usize); 4] {
        let wide = match self {
            Engine::Serial => (Options::training(6), 300),
            Engine::Threaded => (Options::training(4), 2 << 20),
        };
        [
            (Options::training(12), 4),
            (Options::training(7), 4),
            (Options::forward_only(9, 2), 4),
            wide,
        ]
    }
}

fn main() -> ExitCode {
    let mut jobs = Vec::new();
    for engine in [Engine::Serial, Engine::Threaded] {
        for widths in WIDTHS {
            let list: Vec<String> = widths.iter().map(usize::to_string).collect();
            jobs.push(
                Job::new(
                    format!("mpi_pipeline_{}_widths_{}", engine.name(), list.join("_")),
                    widths.iter().sum(),
                )
                .args(["--widths", &list.join(","), "--engine", engine.name()])
                .timeout(Duration::from_secs(120)),
            );
        }
    }
    #[cfg(all(feature = "nccl", feature = "mpi"))]
    for (name, arg) in [
        ("mpi_nccl_channels_np2", "--nccl"),
        (
            "mpi_nccl_channels_refused_when_funneled_np2",
            "--nccl-funneled",
        ),
    ] {
        jobs.push(Job::new(name, 2).arg(arg).timeout(Duration::from_secs(60)));
    }
    launcher::main(jobs, rank_main)
}

/// One rank: the runs of the module doc; a rank whose check fails aborts
/// the job (its peers would otherwise wait for it forever).
fn rank_main(args: &[String]) -> Result<(), String> {
    #[cfg(all(feature = "nccl", feature = "mpi"))]
    if let Some(arg) = args.iter().find(|a| a.starts_with("--nccl")) {
        return mpi_nccl::channels_or_a_named_error(arg == "--nccl-funneled");
    }
    let widths: Vec<usize> = launcher::flag_value(args, "--widths")
        .unwrap_or_default()
        .split(',')
        .filter_map(|x| x.parse().ok())
        .collect();
    let engine = match launcher::flag_value(args, "--engine") {
        Some("serial") => Engine::Serial,
        Some("threaded") => Engine::Threaded,
        other => return Err(format!("unknown --engine {other:?}")),
    };
    let mut comm = MpiComm::init(false).map_err(|e| format!("MPI init: {e}"))?;
    match checks(&mut comm, &widths, engine) {
        Ok(()) => Ok(()),
        Err(message) => comm.abort(1, &message),
    }
}

/// Runs `f` as this rank's stage with `engine`: the pipeline is finished
/// when `f` returns `Ok` and aborted with its error otherwise; with helper
/// threads, every helper has ended when this returns (or it is an error),
/// so no duplicate is in use when MPI is finalised.
fn run_engine<R: Send>(
    engine: Engine,
    comm: &mut MpiComm,
    spec: &PipelineSpec,
    options: Options,
    f: impl FnOnce(&Pipeline) -> Result<R, TestError> + Send,
) -> Result<R, TestError> {
    let plan = StagePlan::new(spec, comm.rank())?;
    if engine == Engine::Serial {
        return run_serial(plan, options, comm, f);
    }
    let original = &*comm;
    let set = duplicate_channels(&plan, &options, |_key| {
        original
            .duplicate()
            .map_err(|e| PipelineError::Start(e.to_string()))
    })?;
    let pipe = Pipeline::start(plan, options, set)?;
    let helpers = pipe.helpers();
    let result = finish_or_abort(pipe, f);
    if !helpers.wait_timeout(HELPERS_TIMEOUT) {
        return Err(TestError(format!(
            "rank {}: {} helper threads still running {HELPERS_TIMEOUT:?} after the run ended \
             ({})",
            original.rank(),
            helpers.running(),
            result.err().map_or_else(|| "ok".into(), |e| e.0)
        )));
    }
    result
}

fn checks(comm: &mut MpiComm, widths: &[usize], engine: Engine) -> Result<(), String> {
    let rank = comm.rank();
    let spec = spec_for(widths);
    if spec.world_size != comm.size() {
        return Err(format!(
            "widths {widths:?} need {} ranks, mpirun gave {}",
            spec.world_size,
            comm.size()
        ));
    }
    for (options, cols) in engine.runs() {
        let report = run_engine(engine, comm, &spec, options, |pipe| {
            run_stage_wide(pipe, &(), cols)
        })
        .map_err(|e| format!("rank {rank}, {engine:?}, {options:?}, {cols} columns: {e}"))?;
        let mut sums = [
            report.received_forward as i64,
            report.received_backward as i64,
        ];
        comm.allreduce(&mut sums, ReduceOp::Sum, Scale::NONE)
            .map_err(|e| format!("rank {rank}: allreduce: {e}"))?;
        let (forward, backward) = totals(widths, options.iterations, options.is_forward_only());
        if sums != [forward as i64, backward as i64] {
            return Err(format!(
                "rank {rank}, {engine:?}, {options:?}: the pipeline received {sums:?} messages, \
                 expected {:?}",
                [forward, backward]
            ));
        }
        if rank == 0 {
            println!(
                "  {widths:?} {engine:?} {options:?}, {cols} columns: {forward} forward, \
                 {backward} backward messages"
            );
        }
    }
    if widths == [1, 2, 1] {
        failing_stage(comm, engine)?;
    }
    comm.barrier()
        .map_err(|e| format!("rank {rank}: final barrier: {e}"))
}

/// Rank 2 gives up after its first minibatch: ranks 0 and 3, its
/// neighbours, must fail naming it.
fn failing_stage(comm: &mut MpiComm, engine: Engine) -> Result<(), String> {
    let rank = comm.rank();
    let spec = spec_for(&[1, 2, 1]);
    let outcome = run_engine(engine, comm, &spec, Options::training(12), |pipe| {
        if rank == 2 {
            pipe.recv("h1", 1, Direction::Forward)?;
            return Err(TestError("injected failure on rank 2".into()));
        }
        run_stage(pipe, &())
    });
    let message = match outcome {
        Ok(_) => {
            return Err(format!(
                "rank {rank}, {engine:?}: the run with a failing rank 2 succeeded"
            ))
        }
        Err(e) => e.0,
    };
    let expected = match rank {
        2 => "injected failure on rank 2",
        0 | 3 => "rank 2 (stage 1) failed",
        _ => "",
    };
    if !message.contains(expected) {
        return Err(format!(
            "rank {rank}, {engine:?}: expected an error containing '{expected}', got: {message}"
        ));
    }
    if rank == 0 {
        println!("  failing rank 2, {engine:?}: rank 0 saw: {message}");
    }
    Ok(())
}
