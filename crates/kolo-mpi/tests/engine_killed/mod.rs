//! A rank SIGKILLed in the middle of a collective, under a real `mpirun`
//! (part of the `engine` test binary), at 2, 3 and 4 processes: MPI has
//! no way to tell the survivors, which wait in the collective, so
//! OpenMPI must end the whole job. The job must end within
//! [`JOB_BOUND`] with `mpirun` exiting non-zero, its output naming the
//! killed rank and the signal, and no rank's process left running.

use kolo::{Config, Error, Kolo, ReduceOp};
use kolo_mpi::launcher::{streams, Job, Verdict};
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

/// How long the job may take to end once started (it takes seconds; a
/// job still running at the bound hangs, and fails).
const JOB_BOUND: Duration = Duration::from_secs(60);
/// The step in which the last rank dies, its allreduces in flight.
const KILL_STEP: usize = 3;
/// Allreduces per step, and f32 elements each (1 MiB).
const TENSORS: usize = 2;
const ELEMENTS: usize = 1 << 18;
/// Steps a survivor would run (it never gets past [`KILL_STEP`]).
const STEPS: usize = 100;
/// How long the killed rank's processes get to be gone after `mpirun`
/// exited.
const GRACE: Duration = Duration::from_secs(10);

const PREFIX: &str = "killed_mid_collective_";

/// The jobs: the last rank killed, at 2, 3 and 4 processes. `job` adds
/// the settings every job of the binary shares; `dir` holds the ranks'
/// pid files.
pub fn jobs(job: impl Fn(&str, usize) -> Job, dir: &str) -> Vec<Job> {
    [2usize, 3, 4]
        .into_iter()
        .map(|np| {
            let name = format!("rank{}_{PREFIX}np{np}", np - 1);
            job(&name, np).timeout(JOB_BOUND).args([
                "--kill",
                &(np - 1).to_string(),
                "--dir",
                dir,
                "--job",
                &name,
            ])
        })
        .collect()
}

/// True for the jobs of this module.
pub fn is_mine(job: &Job) -> bool {
    job.name.contains(PREFIX)
}

/// The verdicts of one of this module's jobs: `mpirun` ended in time,
/// non-zero, naming the killed rank and signal 9, and none of the job's
/// processes is still running.
pub fn verdicts(job: &Job, result: &Result<Output, String>, dir: &Path) -> Vec<Verdict> {
    let killed = job.np - 1;
    let ended = match result {
        Err(why) => Some(format!("mpirun did not end the job: {why}")),
        Ok(out) if out.status.success() => Some(format!(
            "mpirun exited 0 although rank {killed} was killed\n{}",
            streams(out)
        )),
        Ok(out) => {
            let text = streams(out);
            let named = text.contains(&format!("rank {killed} ")) && text.contains("signal 9");
            (!named).then(|| format!("the output names neither rank {killed} nor signal 9\n{text}"))
        }
    };
    let left = leftovers(dir, &job.name, job.np);
    vec![
        Verdict::new(
            format!("{}::mpirun_ends_the_job_naming_rank_{killed}", job.name),
            ended,
        ),
        Verdict::new(format!("{}::no_rank_left_running", job.name), left),
    ]
}

/// One rank: trains until the last rank kills itself in step
/// [`KILL_STEP`], with its allreduces submitted; the others wait in that
/// step until `mpirun` ends them. Writes its pid first, for
/// [`leftovers`].
pub fn rank_main(config: Config, args: &[String]) -> Result<(), String> {
    use kolo_mpi::launcher::flag_value;
    let (Some(killed), Some(dir), Some(job)) = (
        flag_value(args, "--kill").and_then(|k| k.parse::<usize>().ok()),
        flag_value(args, "--dir"),
        flag_value(args, "--job"),
    ) else {
        return Err(format!("--kill RANK --dir DIR --job NAME, got {args:?}"));
    };
    let pid = std::process::id();
    let file = Path::new(dir).join(format!("{job}.pid.{pid}"));
    std::fs::write(&file, b"").map_err(|e| format!("{}: {e}", file.display()))?;
    let kolo = Kolo::init_mpi(config).map_err(|e| format!("Kolo::init_mpi: {e}"))?;
    let rank = kolo.rank();
    for step in 0..STEPS {
        let dies = rank == killed && step == KILL_STEP;
        train_step(&kolo, || {
            if dies {
                kill_self()
            }
        })
        .map_err(|e| format!("rank {rank}, step {step}: {e}"))?;
    }
    Err(format!(
        "rank {rank}: {STEPS} steps ran although rank {killed} was killed"
    ))
}

/// [`TENSORS`] allreduces in flight; `submitted` runs once they are.
fn train_step(kolo: &Kolo, submitted: impl FnOnce()) -> Result<(), Error> {
    let mut grads = vec![vec![kolo.rank() as f32; ELEMENTS]; TENSORS];
    kolo.scope(|s| {
        let handles = grads
            .iter_mut()
            .enumerate()
            .map(|(t, g)| s.allreduce_async(&format!("grad/{t}"), g, ReduceOp::Sum))
            .collect::<Result<Vec<_>, _>>()?;
        submitted();
        handles.into_iter().try_for_each(|h| h.wait())
    })
}

/// SIGKILL to this process: no handler runs, MPI is not finalised.
fn kill_self() {
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status();
    // Only reached if the kill failed; the job then runs to its bound.
    std::thread::sleep(JOB_BOUND);
}

/// The job's processes still alive after [`GRACE`] (by the pid files its
/// ranks wrote; a pid counts while `/proc` shows it running this test
/// binary). Those found are killed, since the test started them.
fn leftovers(dir: &Path, job: &str, np: usize) -> Option<String> {
    let prefix = format!("{job}.pid.");
    let pids: Vec<u32> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix(&prefix)?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let exe = std::env::current_exe().ok();
    let alive = |pid: &u32| {
        let proc = Path::new("/proc").join(pid.to_string());
        let running = std::fs::read_to_string(proc.join("stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().to_owned())
            })
            .is_some_and(|rest| !rest.starts_with('Z'));
        running && std::fs::read_link(proc.join("exe")).ok() == exe
    };
    let deadline = Instant::now() + GRACE;
    let mut left: Vec<u32> = pids.iter().copied().filter(alive).collect();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left.retain(alive);
    }
    for pid in &left {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    if pids.len() != np {
        Some(format!(
            "{} of {np} ranks wrote their pid: {pids:?}",
            pids.len()
        ))
    } else if !left.is_empty() {
        Some(format!(
            "processes still running after mpirun ended (now killed): {left:?}"
        ))
    } else {
        None
    }
}
