//! Starting a program under `mpirun` from itself: how kolo's MPI tests (and
//! any tool that wants to) run under a real `mpirun` from `cargo test`.
//!
//! A `harness = false` test binary hands its `main` to [`main`] (or
//! [`main_with`]): started by `cargo test`, the binary re-runs itself under
//! `mpirun` once per [`Job`] and reports each job (or each case a job's
//! output names, through a judge) libtest style, with a summary and the
//! exit code; started by `mpirun`, it is one rank and runs the rank
//! closure. Jobs are bounded by a timeout, so a hung job fails instead of
//! hanging CI.
//!
//! ```
//! use kolo_mpi::launcher::{self, Job};
//! use kolo_mpi::MpiComm;
//! use kolo_protocol::ReduceOp;
//! use kolo_transport::{Collectives, Scale, Topology};
//!
//! fn main() -> std::process::ExitCode {
//!     // Two tests: jobs of 2 and 3 processes, every rank given `--count`.
//!     let jobs = [2, 3].map(|np| Job::new(format!("count_np{np}"), np).arg("--count"));
//!     launcher::main(jobs.to_vec(), |args| {
//!         // One rank: every rank adds 1, which makes the job's size.
//!         let mut comm = MpiComm::init(false).map_err(|e| e.to_string())?;
//!         let mut ones = [1i32];
//!         comm.allreduce(&mut ones, ReduceOp::Sum, Scale::NONE)
//!             .map_err(|e| e.to_string())?;
//!         if args != ["--count"] || ones[0] as usize != comm.size() {
//!             return Err(format!("rank {}: args {args:?}, sum {}", comm.rank(), ones[0]));
//!         }
//!         Ok(())
//!     })
//! }
//! ```

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, ExitCode, Output};
use std::time::{Duration, Instant};

/// How long a [`Job`] may run unless it says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// One `mpirun` job of a self-launching test binary: its name (the test's
/// name in the report), process count, the arguments each rank gets, extra
/// environment, and how long it may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// The test name reported.
    pub name: String,
    /// Processes (`mpirun -np`).
    pub np: usize,
    /// Arguments of every rank.
    pub args: Vec<String>,
    /// Environment of every rank (on top of the settings [`mpirun_self`]
    /// gives every job).
    pub env: Vec<(String, String)>,
    /// The job is killed, and fails, after this long.
    pub timeout: Duration,
}

impl Job {
    /// A job of `np` processes without arguments, with [`DEFAULT_TIMEOUT`].
    pub fn new(name: impl Into<String>, np: usize) -> Job {
        Job {
            name: name.into(),
            np,
            args: Vec::new(),
            env: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Adds an argument for every rank.
    pub fn arg(mut self, arg: impl Into<String>) -> Job {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments for every rank.
    pub fn args<I, S>(mut self, args: I) -> Job
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for every rank.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Job {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Job {
        self.timeout = timeout;
        self
    }

    /// Runs `program` (with the job's arguments) under `mpirun` as this
    /// job; see [`mpirun_self`].
    pub fn run(&self, program: &Path) -> Result<Output, String> {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        mpirun_self(program, self.np, &self.args, &env, self.timeout)
    }

    /// Like [`Job::run`], but a job that does not exit 0 is an error too,
    /// whose message has the exit status and both output streams.
    pub fn run_checked(&self, program: &Path) -> Result<Output, String> {
        let output = self.run(program)?;
        if output.status.success() {
            Ok(output)
        } else {
            Err(format!(
                "mpirun -np {} {} {}: {}\n{}",
                self.np,
                program.display(),
                self.args.join(" "),
                output.status,
                streams(&output)
            ))
        }
    }
}

/// Both output streams of a job, for messages.
pub fn streams(output: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// One reported test: its name and, when it failed, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The test name.
    pub name: String,
    /// Why it failed; `None` when it passed.
    pub failure: Option<String>,
}

impl Verdict {
    /// A verdict.
    pub fn new(name: impl Into<String>, failure: Option<String>) -> Verdict {
        Verdict {
            name: name.into(),
            failure,
        }
    }

    /// libtest's line for it (and the reason when it failed).
    pub fn print(&self) {
        match &self.failure {
            None => println!("test {} ... ok", self.name),
            Some(why) => println!("test {} ... FAILED\n{why}", self.name),
        }
    }
}

/// The plain judge of a job: one verdict, passed when `mpirun` exited 0.
/// A passing job's standard output is printed (rank 0's notes).
fn exit_status(job: &Job, result: &Result<Output, String>) -> Vec<Verdict> {
    let failure = match result {
        Ok(output) if output.status.success() => {
            print!("{}", String::from_utf8_lossy(&output.stdout));
            None
        }
        Ok(output) => Some(format!(
            "the job ended with {}\n{}",
            output.status,
            streams(output)
        )),
        Err(why) => Some(why.clone()),
    };
    vec![Verdict::new(job.name.clone(), failure)]
}

/// Runs `jobs` of `program` one after another, judging each result with
/// `judge` and printing every verdict (and the job's time) as it comes.
pub fn run_jobs<J>(program: &Path, jobs: &[Job], mut judge: J) -> Vec<Verdict>
where
    J: FnMut(&Job, &Result<Output, String>) -> Vec<Verdict>,
{
    let mut verdicts = Vec::new();
    for job in jobs {
        let started = Instant::now();
        let result = job.run(program);
        println!(
            "# {} (mpirun -np {}): {:.1} s",
            job.name,
            job.np,
            started.elapsed().as_secs_f64()
        );
        for verdict in judge(job, &result) {
            verdict.print();
            verdicts.push(verdict);
        }
    }
    verdicts
}

/// The `main` of a self-launching test binary with plain jobs: each job is
/// one test, passed when every rank exits 0 (see [`main_with`]).
pub fn main<R>(jobs: Vec<Job>, rank: R) -> ExitCode
where
    R: FnOnce(&[String]) -> Result<(), String>,
{
    main_with(rank, |exe| run_jobs(exe, &jobs, exit_status))
}

/// The `main` of a self-launching test binary.
///
/// - Started by `mpirun` ([`under_mpirun`]): this process is one rank; it
///   runs `rank` with its arguments (without the program name) and exits
///   0, or prints the error and exits 1.
/// - Started with `--list` (`cargo test -- --list`): lists nothing and
///   exits 0 without starting any job.
/// - Otherwise: `parent` gets this binary's path, runs its jobs (usually
///   through [`run_jobs`]) and returns the verdicts; a libtest-style
///   summary follows, and the exit code is 1 when any verdict failed.
pub fn main_with<R, P>(rank: R, parent: P) -> ExitCode
where
    R: FnOnce(&[String]) -> Result<(), String>,
    P: FnOnce(&Path) -> Vec<Verdict>,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    if under_mpirun() {
        return match rank(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("{message}");
                ExitCode::FAILURE
            }
        };
    }
    if args.iter().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this test binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let verdicts = parent(&exe);
    let failed = verdicts.iter().filter(|v| v.failure.is_some()).count();
    println!(
        "\ntest result: {}. {} passed; {failed} failed; finished in {:.2}s",
        if failed == 0 { "ok" } else { "FAILED" },
        verdicts.len() - failed,
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The value following `flag` in `args` (`--widths 1,2,1`).
pub fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

/// True when this process was started by `mpirun` (OpenMPI or MPICH / Hydra).
pub fn under_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The `mpirun` command (`$KOLO_MPIRUN`, else `mpirun`) with what root and
/// containers need: see [`mpirun_self`].
fn mpirun_command(np: usize) -> Command {
    let mpirun = std::env::var_os("KOLO_MPIRUN").unwrap_or_else(|| "mpirun".into());
    let mut cmd = Command::new(&mpirun);
    cmd.arg("-np").arg(np.to_string());
    if is_openmpi(&mpirun) {
        cmd.args(["--oversubscribe", "--bind-to", "none"]);
        // These only relax OpenMPI's checks and narrow its transports.
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

fn is_openmpi(mpirun: &OsStr) -> bool {
    Command::new(mpirun)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"))
        .unwrap_or(true)
}

/// Runs `program args...` under `mpirun -np np` (`$KOLO_MPIRUN` names
/// another launcher) with `envs` on top of its own settings, killing it
/// after `timeout` (a hung job must fail the test, not hang CI). Returns
/// the combined output or a message saying what went wrong.
///
/// Under OpenMPI the job may run as root and oversubscribe the cores (CI
/// has 2, tests start 4 processes), ranks yield the core while they wait,
/// shared memory goes without the cross-memory-attach single-copy
/// mechanism (ptrace is often forbidden in containers), and no network
/// interface beyond loopback is probed.
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    fn output(code: i32, stdout: &str, stderr: &str) -> Output {
        Output {
            // A wait status: the exit code in the second byte.
            status: ExitStatus::from_raw(code << 8),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
        }
    }

    #[test]
    fn jobs_carry_their_arguments_environment_and_timeout() {
        let job = Job::new("ring_np3", 3)
            .arg("--ring")
            .args(["--size", "64"])
            .env("KOLO_CYCLE_TIME", "1")
            .timeout(Duration::from_secs(5));
        assert_eq!(job.args, ["--ring", "--size", "64"]);
        assert_eq!(job.env, [("KOLO_CYCLE_TIME".into(), "1".into())]);
        assert_eq!((job.np, job.timeout), (3, Duration::from_secs(5)));
        assert_eq!(flag_value(&job.args, "--size"), Some("64"));
        assert_eq!(flag_value(&job.args, "--ring"), Some("--size"));
        assert_eq!(flag_value(&job.args, "--missing"), None);
        assert_eq!(flag_value(&["--last".to_string()], "--last"), None);
    }

    #[test]
    fn the_plain_judge_passes_exit_0_only_and_keeps_the_output() {
        let job = Job::new("j", 2);
        let passed = exit_status(&job, &Ok(output(0, "", "")));
        assert_eq!(passed, [Verdict::new("j", None)]);
        let failed = exit_status(&job, &Ok(output(3, "out", "err")));
        let why = failed[0].failure.clone().unwrap_or_default();
        assert!(why.contains("stdout:\nout\nstderr:\nerr"), "{why}");
        let hung = exit_status(&job, &Err("timed out".into()));
        assert_eq!(hung, [Verdict::new("j", Some("timed out".into()))]);
    }
}
