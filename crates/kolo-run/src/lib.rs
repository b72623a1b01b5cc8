//! kolo-run: starts the processes of a kolo job on this host with the
//! variables torchrun sets, and watches them (the `kolo-run` binary is
//! this crate's front end). [`plan`] computes each rank's variables;
//! [`launch`] starts and supervises them; [`run_captured`] runs a local
//! job with every rank's output kept, for tests and tools that check what
//! each rank printed; [`netns`] runs one across two hosts made of network
//! namespaces.
//!
//! ```
//! use std::time::Duration;
//! let ranks = kolo_run::run_captured(
//!     3,
//!     "sh".as_ref(),
//!     &["-c", "echo $RANK of $WORLD_SIZE"],
//!     &[],
//!     Duration::from_secs(30),
//! )?;
//! assert!(ranks.iter().all(|r| r.succeeded()));
//! assert_eq!(ranks[2].stdout.trim(), "2 of 3");
//! # Ok::<(), String>(())
//! ```

pub mod launch;
pub mod netns;
pub mod plan;

use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What one rank of [`run_captured`] did.
#[derive(Debug)]
pub struct RankOutput {
    /// The rank.
    pub rank: usize,
    /// How it ended (`None`: killed at the bound).
    pub status: Option<ExitStatus>,
    /// What it printed.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
}

impl RankOutput {
    /// True when the rank exited 0.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs `program args` as `ranks` processes of a job on this host (a free
/// port on loopback, a random token) with `env` added, keeps what each
/// prints, and waits for all of them, killing (with what they started)
/// those still running after `bound`.
pub fn run_captured(
    ranks: usize,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    bound: Duration,
) -> Result<Vec<RankOutput>, String> {
    use std::os::unix::process::CommandExt;
    let plan = plan::Plan::new(ranks, 1, 0, "127.0.0.1", 0, None)?;
    let mut running = Vec::with_capacity(ranks);
    for local in 0..ranks {
        let mut child = Command::new(program)
            .args(args)
            .envs(plan.variables(local))
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting rank {local} ({}): {e}", program.display()))?;
        // Read as they write, so that no rank blocks on a full pipe.
        let out = child.stdout.take().map(drain);
        let err = child.stderr.take().map(drain);
        running.push((child, out, err));
    }
    Ok(collect(running, bound))
}

/// A started rank: its process and the threads reading its output.
type Running = (
    std::process::Child,
    Option<std::thread::JoinHandle<String>>,
    Option<std::thread::JoinHandle<String>>,
);

/// Waits for every rank of `running` (in rank order) until `bound` from
/// now, kills the process group of any still running then, and returns
/// what each did.
fn collect(running: Vec<Running>, bound: Duration) -> Vec<RankOutput> {
    let deadline = Instant::now() + bound;
    let mut outputs = Vec::with_capacity(running.len());
    for (rank, (mut child, out, err)) in running.into_iter().enumerate() {
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    launch::kill_group(&child);
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let text = |h: Option<std::thread::JoinHandle<String>>| {
            h.and_then(|h| h.join().ok()).unwrap_or_default()
        };
        outputs.push(RankOutput {
            rank,
            status,
            stdout: text(out),
            stderr: text(err),
        });
    }
    outputs
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
