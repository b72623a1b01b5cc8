//! kolo-pipeline over MPI under a real `mpirun`, one rank per process, with
//! the serial engine (a process has one MPI communicator).
//!
//! `cargo test` runs this binary directly; it re-runs itself under
//! `mpirun -np <ranks>` for each set of stage widths. Every rank runs
//! training passes (12 minibatches, and 7, which no width > 1 divides),
//! then a forward-only pass with acks; the message totals are summed over
//! the ranks. With widths 1, 2, 1 a last run makes rank 2 fail and checks
//! that its neighbours fail naming it (through the abort it sends), not
//! hang.

mod common;

use common::{run_stage, run_stage_wide, spec_for, totals, TestError};
use kolo_mpi::launcher::{mpirun_self, under_mpirun};
use kolo_mpi::MpiComm;
use kolo_pipeline::{run_serial, Direction, Options, StagePlan};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Scale, Topology};
use std::time::{Duration, Instant};

const WIDTHS: [&[usize]; 4] = [&[1, 1], &[1, 2, 1], &[2, 3], &[1, 3, 2, 1]];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if under_mpirun() {
        let widths = args
            .iter()
            .position(|a| a == "--widths")
            .and_then(|i| args.get(i + 1))
            .map(|w| {
                w.split(',')
                    .filter_map(|x| x.parse().ok())
                    .collect::<Vec<usize>>()
            })
            .unwrap_or_default();
        std::process::exit(match rank_main(&widths) {
            Ok(()) => 0,
            Err(message) => {
                eprintln!("{message}");
                1
            }
        });
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this test binary: {e}");
            std::process::exit(1);
        }
    };
    let mut failed = 0;
    for widths in WIDTHS {
        let np: usize = widths.iter().sum();
        let list: Vec<String> = widths.iter().map(usize::to_string).collect();
        let name = format!("mpi_pipeline_widths_{}", list.join("_"));
        let started = Instant::now();
        let outcome = mpirun_self(
            &exe,
            np,
            ["--widths", &list.join(",")],
            &[],
            Duration::from_secs(120),
        );
        match outcome {
            Ok(out) if out.status.success() => {
                println!(
                    "test {name} ... ok ({:.1} s)",
                    started.elapsed().as_secs_f64()
                );
                print!("{}", String::from_utf8_lossy(&out.stdout));
            }
            Ok(out) => {
                failed += 1;
                println!("test {name} ... FAILED ({})", out.status);
                println!("stdout:\n{}", String::from_utf8_lossy(&out.stdout));
                println!("stderr:\n{}", String::from_utf8_lossy(&out.stderr));
            }
            Err(message) => {
                failed += 1;
                println!("test {name} ... FAILED\n{message}");
            }
        }
    }
    let passed = WIDTHS.len() - failed;
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed > 0 {
        std::process::exit(1);
    }
}

/// One rank: the runs of the module doc; a rank whose check fails aborts
/// the job (its peers would otherwise wait for it forever).
fn rank_main(widths: &[usize]) -> Result<(), String> {
    let mut comm = MpiComm::init(false).map_err(|e| format!("MPI init: {e}"))?;
    match checks(&mut comm, widths) {
        Ok(()) => Ok(()),
        Err(message) => comm.abort(1, &message),
    }
}

fn checks(comm: &mut MpiComm, widths: &[usize]) -> Result<(), String> {
    let rank = comm.rank();
    let spec = spec_for(widths);
    if spec.world_size != comm.size() {
        return Err(format!(
            "widths {widths:?} need {} ranks, mpirun gave {}",
            spec.world_size,
            comm.size()
        ));
    }
    // The serial engine needs sends that complete without their receiver:
    // the last run's tensors (up to 3 x 300 f32, 3.6 KB) stay within
    // OpenMPI's shared-memory eager limit (4 KB).
    let runs = [
        (Options::training(12), 4),
        (Options::training(7), 4),
        (Options::forward_only(9, 2), 4),
        (Options::training(6), 300),
    ];
    for (options, cols) in runs {
        let plan = StagePlan::new(&spec, rank).map_err(|e| e.to_string())?;
        let report = run_serial(plan, options, comm, |pipe| run_stage_wide(pipe, &(), cols))
            .map_err(|e| format!("rank {rank}, {options:?}: {e}"))?;
        let mut sums = [
            report.received_forward as i64,
            report.received_backward as i64,
        ];
        comm.allreduce(&mut sums, ReduceOp::Sum, Scale::NONE)
            .map_err(|e| format!("rank {rank}: allreduce: {e}"))?;
        let (forward, backward) = totals(widths, options.iterations, options.is_forward_only());
        if sums != [forward as i64, backward as i64] {
            return Err(format!(
                "rank {rank}, {options:?}: the pipeline received {sums:?} messages, expected {:?}",
                [forward, backward]
            ));
        }
        if rank == 0 {
            println!("  {widths:?} {options:?}, {cols} columns: {forward} forward, {backward} backward messages");
        }
    }
    if widths == [1, 2, 1] {
        failing_stage(comm)?;
    }
    comm.barrier()
        .map_err(|e| format!("rank {rank}: final barrier: {e}"))
}

/// Rank 2 gives up after its first minibatch: ranks 0 and 3, its
/// neighbours, must fail naming it.
fn failing_stage(comm: &mut MpiComm) -> Result<(), String> {
    let rank = comm.rank();
    let spec = spec_for(&[1, 2, 1]);
    let plan = StagePlan::new(&spec, rank).map_err(|e| e.to_string())?;
    let outcome = run_serial(plan, Options::training(12), comm, |pipe| {
        if rank == 2 {
            pipe.recv("h1", 1, Direction::Forward)?;
            return Err(TestError("injected failure on rank 2".into()));
        }
        run_stage(pipe, &())
    });
    let message = match outcome {
        Ok(_) => {
            return Err(format!(
                "rank {rank}: the run with a failing rank 2 succeeded"
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
            "rank {rank}: expected an error containing '{expected}', got: {message}"
        ));
    }
    if rank == 0 {
        println!("  failing rank 2: rank 0 saw: {message}");
    }
    Ok(())
}
