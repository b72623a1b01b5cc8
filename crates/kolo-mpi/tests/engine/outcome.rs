//! Reading a job's output into per-case verdicts (pure functions over the
//! text the ranks printed).

use super::cases::CASES;
use kolo_mpi::launcher::{streams as text, Verdict};
use std::process::Output;

/// The marker of a rank's case line: `kolo-case NAME RANK ok` or
/// `kolo-case NAME RANK FAILED why`.
pub const CASE: &str = "kolo-case";
/// The marker of a rank's result digest: `kolo-digest NAME RANK HEX`.
pub const DIGEST: &str = "kolo-digest";

/// The verdict of every case of a suite job with `np` ranks, plus one for
/// the job's exit status.
pub fn suite(job: &str, np: usize, result: &Result<Output, String>) -> Vec<Verdict> {
    let output = match result {
        Ok(output) => output,
        Err(why) => return vec![Verdict::new(format!("{job}::mpirun"), Some(why.clone()))],
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut verdicts: Vec<Verdict> = CASES
        .iter()
        .map(|(case, _)| {
            let failure =
                case_failure(&stdout, case, np).map(|why| format!("{why}\n{}", text(output)));
            Verdict::new(format!("{job}::{case}"), failure)
        })
        .collect();
    let exit = (!output.status.success())
        .then(|| format!("the job ended with {}\n{}", output.status, text(output)));
    verdicts.push(Verdict::new(format!("{job}::every_process_exits_0"), exit));
    verdicts
}

/// Why `case` did not pass on all `np` ranks according to `stdout`, or
/// `None` when every rank reported it ok.
pub fn case_failure(stdout: &str, case: &str, np: usize) -> Option<String> {
    let mut ok = vec![false; np];
    let mut failures = Vec::new();
    for line in stdout.lines() {
        let mut words = line.splitn(4, ' ');
        if words.next() != Some(CASE) || words.next() != Some(case) {
            continue;
        }
        let rank = words.next().and_then(|r| r.parse::<usize>().ok());
        match (rank, words.next()) {
            (Some(r), Some("ok")) if r < np => ok[r] = true,
            (Some(r), Some(rest)) => failures.push(format!("rank {r}: {rest}")),
            _ => failures.push(format!("malformed line {line:?}")),
        }
    }
    if !failures.is_empty() {
        return Some(failures.join("\n"));
    }
    let missing: Vec<usize> = (0..np).filter(|&r| !ok[r]).collect();
    (!missing.is_empty()).then(|| format!("ranks {missing:?} did not report the case"))
}

/// Every `kolo-digest` line of a job: (case, rank, digest).
pub fn digests(output: &Output) -> Vec<(String, usize, String)> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            if words.next() != Some(DIGEST) {
                return None;
            }
            let case = words.next()?.to_owned();
            let rank = words.next()?.parse().ok()?;
            Some((case, rank, words.next()?.to_owned()))
        })
        .collect()
}

/// One job's result: its name, its process count, and its digests as
/// (case, rank, digest).
pub type JobDigests = (String, usize, Vec<(String, usize, String)>);

/// Whether jobs `a` and `b` (same process count) reported the same result
/// digests: the cache, fusion and the thread level change how results are
/// reached, never the results.
pub fn compare_digests(a: &str, b: &str, jobs: &[JobDigests]) -> Verdict {
    let find = |name: &str| jobs.iter().find(|(n, _, _)| n == name);
    let name = format!("{b}::results_identical_to_{a}");
    let failure = match (find(a), find(b)) {
        (Some((_, _, da)), Some((_, _, db))) if da.is_empty() => {
            Some(format!("{a} reported no digests (db: {db:?})"))
        }
        (Some((_, _, da)), Some((_, _, db))) => {
            let (mut da, mut db) = (da.clone(), db.clone());
            da.sort();
            db.sort();
            (da != db).then(|| format!("{a}: {da:?}\n{b}: {db:?}"))
        }
        _ => Some(format!("{a} or {b} did not run to the end")),
    };
    Verdict::new(name, failure)
}

/// The verdict of a failure job: `mpirun` must exit non-zero (before the
/// harness's timeout) and the output must name the failed rank.
pub fn failure(job: &str, rank: usize, result: &Result<Output, String>) -> Verdict {
    let name = format!("{job}::the_job_ends_naming_rank_{rank}");
    let failure = match result {
        Err(why) => Some(why.clone()),
        Ok(output) if output.status.success() => Some(format!(
            "mpirun exited 0 although rank {rank} failed\n{}",
            text(output)
        )),
        Ok(output) if !text(output).contains(&format!("rank {rank}")) => Some(format!(
            "the output does not name rank {rank}\n{}",
            text(output)
        )),
        Ok(_) => None,
    };
    Verdict::new(name, failure)
}
