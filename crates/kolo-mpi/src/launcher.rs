//! Starting a program under `mpirun` from itself: how kolo's MPI tests (and
//! any tool that wants to) run under a real `mpirun` from `cargo test`.
//!
//! A test binary calls [`under_mpirun`]; when false it re-runs itself with
//! [`mpirun_self`] for each process count, and when true it is one rank.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// True when this process was started by `mpirun` (OpenMPI or MPICH / Hydra).
pub fn under_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The `mpirun` command with what root and containers need: running as
/// root allowed, oversubscription allowed (CI has 2 cores, tests start 4
/// processes), shared-memory transport without the cross-memory-attach
/// single-copy mechanism (ptrace is often forbidden in containers), and no
/// network interfaces probed beyond loopback.
pub fn mpirun_command(np: usize) -> Command {
    let mut cmd = Command::new(std::env::var_os("KOLO_MPIRUN").unwrap_or_else(|| "mpirun".into()));
    cmd.arg("-np").arg(np.to_string());
    if is_openmpi() {
        cmd.args(["--oversubscribe", "--bind-to", "none"]);
        // SAFETY of the environment: these only relax launcher checks.
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
            .env("OMPI_MCA_btl", "self,vader,tcp")
            .env("OMPI_MCA_btl_tcp_if_include", "lo")
            .env("OMPI_MCA_oob_tcp_if_include", "lo")
            .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
            // Oversubscribed ranks yield the core while they wait.
            .env("OMPI_MCA_mpi_yield_when_idle", "1");
    }
    cmd
}

fn is_openmpi() -> bool {
    Command::new("mpirun")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"))
        .unwrap_or(true)
}

/// Runs `program args...` under `mpirun -np np`, killing it after
/// `timeout` (a hung job must fail the test, not hang CI). Returns the
/// combined output or a message saying what went wrong.
pub fn mpirun_self<I, S>(
    program: &Path,
    np: usize,
    args: I,
    envs: &[(&str, &str)],
    timeout: Duration,
) -> Result<Output, String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = mpirun_command(np);
    cmd.arg(program).args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        format!("cannot start mpirun: {e} (install OpenMPI: scripts/install-deps.sh)")
    })?;
    // Drain both pipes on their own threads so a chatty job cannot block on
    // a full pipe while we wait for it.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out_reader = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let err_reader = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                let stdout = out_reader.join().unwrap_or_default();
                let stderr = err_reader.join().unwrap_or_default();
                return Err(format!(
                    "mpirun -np {np} timed out after {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&stdout),
                    String::from_utf8_lossy(&stderr)
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for mpirun: {e}")),
        }
    };
    Ok(Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    })
}
