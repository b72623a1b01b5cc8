//! Starting the local processes and watching them: the first to fail (a
//! non-zero exit or a signal) is reported and the others are stopped
//! (SIGTERM, then SIGKILL after the grace period), so that no rank is
//! left running and the job's end names its cause.

use crate::plan::Plan;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// How often the children are polled.
const POLL: Duration = Duration::from_millis(10);

/// The signal that asked kolo-run to stop (SIGINT, SIGTERM), or 0. The
/// ranks lead process groups of their own, so a terminal's Ctrl-C reaches
/// kolo-run alone: it stops them.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_stop(signal: libc::c_int) {
    STOP_SIGNAL.store(signal, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM stop the job instead of kolo-run alone.
fn catch_stop_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe {
            libc::signal(
                signal,
                note_stop as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

/// How the job ended badly.
#[derive(Debug)]
pub enum Failure {
    /// A process could not be started.
    Start { rank: usize, reason: String },
    /// kolo-run itself was asked to stop (the signal).
    Stopped { signal: i32 },
    /// A rank exited non-zero or was killed.
    Rank {
        rank: usize,
        pid: u32,
        status: ExitStatus,
    },
}

impl Failure {
    /// kolo-run's exit status for it: the rank's own code, or 128 plus
    /// the signal that killed it, as a shell reports it.
    pub fn code(&self) -> u8 {
        match self {
            Failure::Start { .. } => 127,
            Failure::Stopped { signal } => u8::try_from(128 + signal).unwrap_or(1),
            Failure::Rank { status, .. } => match (status.code(), status.signal()) {
                (Some(code), _) => u8::try_from(code).ok().filter(|c| *c != 0).unwrap_or(1),
                (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
                (None, None) => 1,
            },
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Start { rank, reason } => write!(f, "rank {rank} could not start: {reason}"),
            Failure::Stopped { signal } => write!(
                f,
                "stopped by signal {signal}{}: every rank stopped",
                signal_name(*signal).map_or_else(String::new, |n| format!(" ({n})"))
            ),
            Failure::Rank { rank, pid, status } => match (status.code(), status.signal()) {
                (Some(code), _) => write!(f, "rank {rank} (pid {pid}) exited with status {code}"),
                (None, Some(signal)) => write!(
                    f,
                    "rank {rank} (pid {pid}) was killed by signal {signal}{}",
                    signal_name(signal).map_or_else(String::new, |n| format!(" ({n})"))
                ),
                (None, None) => write!(f, "rank {rank} (pid {pid}) ended: {status}"),
            },
        }
    }
}

fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGINT => "SIGINT",
        libc::SIGBUS => "SIGBUS",
        _ => return None,
    })
}

/// Starts `program` once per local process of `plan` and waits for them:
/// `Ok` when all exited 0, otherwise the first failure (the others
/// stopped).
pub fn run(plan: &Plan, program: &[String], grace: Duration) -> Result<(), Failure> {
    let (exe, args) = program.split_first().ok_or_else(|| Failure::Start {
        rank: plan.rank(0),
        reason: "no program given".into(),
    })?;
    catch_stop_signals();
    let mut children: Vec<(usize, Option<Child>)> = Vec::with_capacity(plan.nproc_per_node);
    for local in 0..plan.nproc_per_node {
        let rank = plan.rank(local);
        let mut command = Command::new(exe);
        // Each rank leads a process group of its own, so that stopping it
        // stops what it started too.
        command
            .args(args)
            .envs(plan.variables(local))
            .process_group(0);
        if plan.nproc_per_node > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
            // torchrun's default: processes sharing a host do not each
            // spawn a thread per core.
            command.env("OMP_NUM_THREADS", "1");
        }
        match command.spawn() {
            Ok(child) => children.push((rank, Some(child))),
            Err(e) => {
                let failure = Failure::Start {
                    rank,
                    reason: format!("{exe}: {e}"),
                };
                stop(&mut children, grace);
                return Err(failure);
            }
        }
    }
    loop {
        let mut running = 0;
        for (rank, slot) in children.iter_mut() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) if status.success() => *slot = None,
                Ok(Some(status)) => {
                    let failure = Failure::Rank {
                        rank: *rank,
                        pid: child.id(),
                        status,
                    };
                    *slot = None;
                    stop(&mut children, grace);
                    return Err(failure);
                }
                Ok(None) => running += 1,
                Err(_) => *slot = None,
            }
        }
        if running == 0 {
            return Ok(());
        }
        let signal = STOP_SIGNAL.load(Ordering::SeqCst);
        if signal != 0 {
            stop(&mut children, grace);
            return Err(Failure::Stopped { signal });
        }
        std::thread::sleep(POLL);
    }
}

/// Kills the process group `child` leads (it and what it started).
pub fn kill_group(child: &Child) {
    signal_group(child, libc::SIGKILL);
}

/// Sends `signal` to the process group `child` leads.
fn signal_group(child: &Child, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: signals the process group of a child of this process
        // that is not reaped yet (so its pid, the group's id, is not
        // reused).
        unsafe { libc::kill(-pid, signal) };
    }
}

/// Stops every child still running with what it started: SIGTERM, then
/// SIGKILL to the groups left after `grace`; reaps them all.
fn stop(children: &mut [(usize, Option<Child>)], grace: Duration) {
    for child in children.iter_mut().filter_map(|(_, c)| c.as_mut()) {
        signal_group(child, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    loop {
        let mut left = 0;
        for (_, slot) in children.iter_mut() {
            if let Some(child) = slot {
                match child.try_wait() {
                    Ok(None) => left += 1,
                    _ => *slot = None,
                }
            }
        }
        if left == 0 {
            return;
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(POLL);
    }
    for child in children.iter_mut().filter_map(|(_, c)| c.as_mut()) {
        signal_group(child, libc::SIGKILL);
        let _ = child.wait();
    }
}
