//! Fault injection through the engine over UCX's TCP transport (issue
//! #24): a rank killed with SIGKILL before, during or after a collective,
//! rank 0 (the rendezvous store's host) killed mid-run, and the store's
//! host gone before anyone connects — at 2, 3 and 4 processes, from the
//! table in `cases.rs`.
//!
//! For each case every survivor's pending or next call must fail with an
//! error naming the lost rank (`Error::RankFailed`) within
//! `rank::DETECTION_BOUND`, without a panic or a hang; the killed process
//! ends by signal 9; every survivor exits 0 having said how it failed;
//! and no process of the job is left running.
//!
//! `cargo test` runs this binary directly (`harness = false`); it starts
//! each case's ranks as copies of itself through `kolo_run::run_captured`
//! (which kills what is still running at [`JOB_BOUND`]) and prints a
//! libtest line per case.

mod cases;
mod leftovers;
mod rank;

use cases::{Case, Fault};
use kolo_run::RankOutput;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long one job may run before its ranks count as hung (and are
/// killed): far above a passing job's few seconds.
const JOB_BOUND: Duration = Duration::from_secs(90);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let case_arg = args.windows(2).find(|w| w[0] == "--case").map(|w| &w[1]);
    if let (Some(name), Ok(rank)) = (case_arg, std::env::var("RANK")) {
        let Some(case) = cases::cases().into_iter().find(|c| &c.name == name) else {
            eprintln!("no case {name}");
            return ExitCode::FAILURE;
        };
        let rank: usize = rank.parse().unwrap_or(usize::MAX);
        return match rank::main(&case, rank) {
            Ok(()) => ExitCode::SUCCESS,
            Err(why) => {
                eprintln!("rank {rank}: {why}");
                ExitCode::FAILURE
            }
        };
    }
    if args.iter().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let started = Instant::now();
    let mut failed = Vec::new();
    let all = cases::cases();
    for case in &all {
        let job_started = Instant::now();
        let outcome = run_case(&exe, case);
        println!(
            "# {case} ({} processes): {:.1} s",
            case.np,
            job_started.elapsed().as_secs_f64()
        );
        match outcome {
            Ok(notes) => {
                println!("test {case} ... ok");
                for note in notes {
                    println!("#   {note}");
                }
            }
            Err(why) => {
                println!("test {case} ... FAILED\n{why}");
                failed.push(case.name.clone());
            }
        }
    }
    let passed = all.len() - failed.len();
    let secs = started.elapsed().as_secs_f64();
    if failed.is_empty() {
        println!("\ntest result: ok. {passed} passed; 0 failed; finished in {secs:.2}s");
        ExitCode::SUCCESS
    } else {
        println!(
            "\ntest result: FAILED. {passed} passed; failed: {failed:?}; finished in {secs:.2}s"
        );
        ExitCode::FAILURE
    }
}

/// Runs `case`'s job and judges every rank; returns the survivors'
/// reports, or what went wrong with every rank's output.
fn run_case(exe: &std::path::Path, case: &Case) -> Result<Vec<String>, String> {
    let env = [
        ("UCX_TLS", "tcp,self"),
        ("KOLO_CYCLE_TIME", "1"),
        ("KOLO_RENDEZVOUS_TIMEOUT", case.rendezvous_timeout()),
    ];
    let ranks = kolo_run::run_captured(case.np, exe, &["--case", &case.name], &env, JOB_BOUND)?;
    let mut problems: Vec<String> = ranks.iter().filter_map(|r| judge(case, r)).collect();
    let groups: Vec<u32> = ranks
        .iter()
        .flat_map(|r| r.stdout.lines())
        .filter_map(|l| l.strip_prefix(rank::PID_LINE))
        .filter_map(|pid| pid.trim().parse().ok())
        .collect();
    if groups.len() != case.np {
        problems.push(format!(
            "{} of {} ranks said their pid",
            groups.len(),
            case.np
        ));
    }
    let left = leftovers::leftovers(&groups);
    if !left.is_empty() {
        problems.push(format!("processes left running (now killed): {left:?}"));
    }
    if problems.is_empty() {
        return Ok(ranks
            .iter()
            .flat_map(|r| r.stdout.lines())
            .filter(|l| l.starts_with(rank::REPORT_LINE))
            .map(str::to_owned)
            .collect());
    }
    let outputs: String = ranks
        .iter()
        .map(|r| {
            format!(
                "--- rank {} ({:?})\n{}{}",
                r.rank, r.status, r.stdout, r.stderr
            )
        })
        .collect();
    Err(format!("{}\n{outputs}", problems.join("\n")))
}

/// What is wrong with how `r` ended, if anything: the lost rank must end
/// as its fault says (signal 9, or exit 0 for a store host that leaves),
/// every other rank must exit 0 having reported its failure; none may be
/// killed at the bound.
fn judge(case: &Case, r: &RankOutput) -> Option<String> {
    let Some(status) = r.status else {
        return Some(format!(
            "rank {} was still running at {JOB_BOUND:?} (hung)",
            r.rank
        ));
    };
    let lost = r.rank == case.lost_rank();
    match case.fault {
        Fault::Killed { .. } if lost => (status.signal() != Some(9))
            .then(|| format!("rank {} ended with {status}, not signal 9", r.rank)),
        Fault::StoreGoneAtStart if lost => {
            (!status.success()).then(|| format!("rank 0 (leaving at once) ended with {status}"))
        }
        _ if !status.success() => Some(format!("survivor rank {} ended with {status}", r.rank)),
        _ if !r.stdout.contains(rank::REPORT_LINE) => Some(format!(
            "survivor rank {} did not report its failure",
            r.rank
        )),
        _ => None,
    }
}
