//! The engine suite (`tests/engine-suite`, the same cases the MPI backend
//! runs under `mpirun`) on kolo-threads' ranks: the main sequence at 1, 2,
//! 3, 4 and 8 ranks, the workload under five other cache and fusion settings
//! (bit-identical results), and the stall inspector.

use kolo::Config;
use kolo_engine_suite::{compare_digests, judge, run_rank, CaseLine, Job, Verdict, WORKLOAD};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// Whether the backend packs fused allreduces into the fusion buffer (see
/// `judge`): kolo-threads reduces the tensors in place.
const PACKS: bool = false;

/// The base configuration: a short cycle time, so idle ranks answer
/// quickly.
fn config() -> Config {
    Config::default().cycle_time(Duration::from_micros(500))
}

/// Runs `job` on threads with its files in `dir`: every rank's lines, and
/// a verdict on how the run ended.
fn run_job(job: &Job, dir: &Path) -> (Vec<CaseLine>, Verdict) {
    let lines = Mutex::new(Vec::new());
    let result = kolo::threads::run(job.ranks, job.configure(config(), dir), |kolo| {
        let outcome = run_rank(kolo, &job.cases, &mut |line| {
            lines.lock().unwrap_or_else(|e| e.into_inner()).push(line)
        });
        // A failed case fails the rank, so that its peers stop too.
        outcome.unwrap_or_else(|why| panic!("{why}"));
        Ok(())
    });
    let ended = Verdict {
        name: format!("{}::every_rank_ends_ok", job.name),
        failure: result.err().map(|e| e.to_string()),
    };
    (lines.into_inner().unwrap_or_else(|e| e.into_inner()), ended)
}

/// Fails the test with every failed verdict.
fn assert_passed(verdicts: &[Verdict]) {
    let failed: Vec<String> = verdicts
        .iter()
        .filter_map(|v| v.failure.as_ref().map(|why| format!("{}: {why}", v.name)))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Runs `job` and judges it.
fn check(job: &Job) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (lines, ended) = run_job(job, dir.path());
    let mut verdicts = judge(job, &lines, dir.path(), PACKS);
    verdicts.push(ended);
    assert_passed(&verdicts);
}

/// One rank: every case holds with no peer (a GPU engine on one GPU
/// runs the same job).
#[test]
fn main_np1() {
    check(&Job::main(1, &[]));
}

#[test]
fn main_np2() {
    check(&Job::main(2, &[]));
}

#[test]
fn main_np3() {
    check(&Job::main(3, &[]));
}

#[test]
fn main_np4() {
    check(&Job::main(4, &[]));
}

#[test]
fn main_np8() {
    check(&Job::main(8, &[]));
}

#[test]
fn stall_np3() {
    check(&Job::stall(3));
}

#[test]
fn timeout_np2() {
    check(&Job::timeout(2));
}

#[test]
fn timeout_np3() {
    check(&Job::timeout(3));
}

/// The workload with the cache and fusion off, each, both, and tiny:
/// results bit-identical to the defaults.
#[test]
fn cache_and_fusion_do_not_change_results() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let reference = Job::new("workload_np4", 4, WORKLOAD.to_vec());
    let (reference_lines, ended) = run_job(&reference, dir.path());
    let mut verdicts = judge(&reference, &reference_lines, dir.path(), PACKS);
    verdicts.push(ended);
    type Settings = fn(Config) -> Config;
    let variants: [(&str, Settings); 5] = [
        ("no_cache", |c| c.cache_capacity(0)),
        ("no_fusion", |c| c.fusion_threshold(0)),
        ("neither", |c| c.cache_capacity(0).fusion_threshold(0)),
        ("tiny_fusion_buffer", |c| c.fusion_threshold(256)),
        ("tiny_cache", |c| c.cache_capacity(2)),
    ];
    for (name, settings) in variants {
        let job =
            Job::new(format!("workload_np4_{name}"), 4, WORKLOAD.to_vec()).with_settings(settings);
        let (lines, ended) = run_job(&job, dir.path());
        verdicts.extend(judge(&job, &lines, dir.path(), PACKS));
        verdicts.push(ended);
        verdicts.push(compare_digests(
            (&reference.name, &reference_lines),
            (&job.name, &lines),
        ));
    }
    assert_passed(&verdicts);
}

/// Every submission style against every other, in any order, at 2, 3 and
/// 4 ranks, with fusion, the cache and a timeline each on and off: exact
/// results everywhere, bit-identical across the settings.
#[test]
fn any_order_any_style() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut verdicts = Vec::new();
    let jobs = kolo_engine_suite::order_jobs(&[2, 3, 4]);
    // The first job of each rank count is the one the others must match.
    let mut reference: std::collections::HashMap<usize, (String, Vec<CaseLine>)> =
        std::collections::HashMap::new();
    for job in &jobs {
        let (lines, ended) = run_job(job, dir.path());
        verdicts.extend(judge(job, &lines, dir.path(), PACKS));
        verdicts.push(ended);
        match reference.get(&job.ranks) {
            Some((name, first)) => {
                verdicts.push(compare_digests((name, first), (&job.name, &lines)))
            }
            None => {
                reference.insert(job.ranks, (job.name.clone(), lines));
            }
        }
    }
    assert_passed(&verdicts);
}
