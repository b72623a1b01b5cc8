//! `--killed`: a rank of a process-mode NCCL job killed with SIGKILL in
//! the middle of a collective. One process per GPU started by kolo-run
//! (`Kolo::init_nccl_ucx`, NCCL bootstrapped through the store, no MPI),
//! two or more: every rank runs 4 MiB device allreduces; at
//! [`KILL_STEP`] the last rank submits its allreduce, lets the others'
//! kernels start waiting for it, and kills itself. Every survivor's
//! allreduce must fail within [`DETECTION_BOUND`] with an error naming
//! the lost rank, and its shutdown must end (the communicator aborted, no
//! stream left waiting); each prints one [`SURVIVOR_LINE`]. Run by
//! `run-engine.sh` on two GPUs:
//! `kolo-run --grace 90 -n 2 ./gpu_engine_ucx --killed`.

use crate::checks::{caller_stream, upload};
use kolo::nccl::NcclOptions;
use kolo::{Config, Error, Kolo, ReduceOp};
use std::time::{Duration, Instant};

/// The step the last rank dies in.
pub const KILL_STEP: usize = 20;
/// How long a survivor's failing call may take.
pub const DETECTION_BOUND: Duration = Duration::from_secs(30);
/// The start of a survivor's report.
pub const SURVIVOR_LINE: &str = "kolo-killed survivor";
/// Elements per allreduce (4 MiB of f32).
const ELEMENTS: usize = 1 << 20;
/// How long the last rank waits after its submission before it dies, so
/// that the others' kernels are under way.
const DYING_DELAY: Duration = Duration::from_millis(50);

/// This process's rank: `Ok` for a survivor whose call failed as it
/// should, an error otherwise (the dying rank never returns).
pub fn run(init: impl FnOnce(Config, NcclOptions) -> Result<Kolo, Error>) -> Result<(), String> {
    let options = NcclOptions {
        // Longer than the bound: the loss must be found by the peer's
        // death, not by the operation's timeout.
        op_timeout: Duration::from_secs(120),
        teardown_timeout: Duration::from_secs(30),
        ..NcclOptions::default()
    };
    let kolo = init(Config::default(), options).map_err(|e| format!("start: {e}"))?;
    let (rank, size) = (kolo.rank(), kolo.size());
    if size < 2 {
        return Err(format!(
            "--killed needs two ranks or more, the job has {size}"
        ));
    }
    let victim = size - 1;
    let stream = caller_stream(&kolo)?;
    let mut tensor = upload(&stream, &vec![1.0f32; ELEMENTS])?;
    for step in 0..KILL_STEP {
        let name = format!("killed/{step}");
        kolo.allreduce(&name, &mut tensor, ReduceOp::Sum)
            .map_err(|e| format!("rank {rank}: step {step} before the kill: {e}"))?;
    }
    let name = format!("killed/{KILL_STEP}");
    if rank == victim {
        let _ = kolo.scope(|scope| -> Result<(), Error> {
            let _pending = scope.allreduce_async(&name, &mut tensor, ReduceOp::Sum)?;
            std::thread::sleep(DYING_DELAY);
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid])
                .status();
            std::thread::sleep(Duration::from_secs(600));
            Ok(())
        });
        return Err(format!("rank {rank} outlived its SIGKILL"));
    }
    let started = Instant::now();
    let outcome = kolo.allreduce(&name, &mut tensor, ReduceOp::Sum);
    let took = started.elapsed();
    let err = match outcome {
        Ok(_) => {
            return Err(format!(
                "rank {rank}: the allreduce succeeded though rank {victim} was killed"
            ))
        }
        Err(e) => e,
    };
    if took > DETECTION_BOUND {
        return Err(format!(
            "rank {rank}: the allreduce failed only after {took:?}: {err}"
        ));
    }
    let named = match &err {
        Error::RankFailed { rank: lost, .. } => *lost == victim,
        other => other.to_string().contains(&format!("rank {victim}")),
    };
    if !named {
        return Err(format!(
            "rank {rank}: the error does not name rank {victim}: {err:?}"
        ));
    }
    let closing = Instant::now();
    let shutdown = kolo.shutdown();
    drop(kolo);
    let closed = closing.elapsed();
    if closed > DETECTION_BOUND {
        return Err(format!(
            "rank {rank}: its shutdown took {closed:?} ({shutdown:?})"
        ));
    }
    println!("{SURVIVOR_LINE} {rank}: failed in {took:?} naming rank {victim} ({err}); shut down in {closed:?}");
    Ok(())
}
