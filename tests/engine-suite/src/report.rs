//! Running a job's cases on one rank, and judging what the ranks reported
//! (pure functions over their [`CaseLine`]s).

use crate::{timeline, Case, Digest, Job};
use kolo::Kolo;
use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// The first word of a case line in text form.
pub const CASE_MARKER: &str = "kolo-case";

/// What one rank reported for one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaseLine {
    /// The case's name.
    pub case: String,
    /// The reporting rank.
    pub rank: usize,
    /// Its digest, or why it failed.
    pub outcome: Result<Digest, String>,
}

impl fmt::Display for CaseLine {
    /// `kolo-case NAME RANK ok [DIGEST]` or `kolo-case NAME RANK FAILED
    /// why` (one line: newlines in `why` become ` | `).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{CASE_MARKER} {} {} ", self.case, self.rank)?;
        match &self.outcome {
            Ok(None) => write!(f, "ok"),
            Ok(Some(digest)) => write!(f, "ok {digest:016x}"),
            Err(why) => write!(f, "FAILED {}", why.replace('\n', " | ")),
        }
    }
}

impl CaseLine {
    /// Reads a line written by `Display`; `None` for any other line.
    pub fn parse(line: &str) -> Option<CaseLine> {
        let mut words = line.splitn(5, ' ');
        if words.next() != Some(CASE_MARKER) {
            return None;
        }
        let case = words.next()?.to_owned();
        let rank = words.next()?.parse().ok()?;
        let outcome = match (words.next()?, words.next()) {
            ("ok", None) => Ok(None),
            ("ok", Some(hex)) => Ok(Some(u64::from_str_radix(hex, 16).ok()?)),
            ("FAILED", why) => Err(why.unwrap_or_default().to_owned()),
            _ => return None,
        };
        Some(CaseLine {
            case,
            rank,
            outcome,
        })
    }
}

/// Runs `cases` in order on this rank, reporting each. Stops at the first
/// failing case (an error or a panic) and returns why, for the runner to
/// abort the rank (so that no peer waits on it).
pub fn run_rank(
    kolo: &Kolo,
    cases: &[Case],
    report: &mut dyn FnMut(CaseLine),
) -> Result<(), String> {
    let rank = kolo.rank();
    for case in cases {
        let outcome = match catch_unwind(AssertUnwindSafe(|| (case.body)(kolo))) {
            Ok(Ok(digest)) => Ok(digest),
            Ok(Err(e)) => Err(format!("error: {e}")),
            Err(panic) => Err(format!("panic: {}", panic_text(panic.as_ref()))),
        };
        let failed = outcome.clone().err();
        report(CaseLine {
            case: case.name.to_owned(),
            rank,
            outcome,
        });
        if let Some(why) = failed {
            return Err(format!("rank {rank} failed case {}: {why}", case.name));
        }
    }
    Ok(())
}

/// The text of a panic's payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a non-string panic payload)".into())
}

/// A digest of values (FNV-1a over their bits).
pub fn digest(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, v| {
        (h ^ v).wrapping_mul(0x100_0000_01b3)
    })
}

/// One named check and why it failed (`None`: passed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `job::case` or `job::check`.
    pub name: String,
    /// Why it failed.
    pub failure: Option<String>,
}

impl Verdict {
    fn new(name: String, failure: Option<String>) -> Verdict {
        Verdict { name, failure }
    }
}

/// The verdicts of `job` from every rank's `lines`: one per case (every
/// rank reported it ok, and its digests agree across ranks), and one for
/// the timeline rank 0 wrote in `dir` if the job has one. `packs`: whether
/// the backend packs fused allreduces into the fusion buffer (MPI), so
/// that the fused row must also show `MEMCPY_IN_FUSION_BUFFER` and
/// `MEMCPY_OUT_FUSION_BUFFER`; kolo-threads reduces the tensors in place.
pub fn judge(job: &Job, lines: &[CaseLine], dir: &Path, packs: bool) -> Vec<Verdict> {
    let mut verdicts: Vec<Verdict> = job
        .cases
        .iter()
        .map(|case| {
            let name = format!("{}::{}", job.name, case.name);
            Verdict::new(name, case_failure(lines, case.name, job.ranks))
        })
        .collect();
    if job.timeline {
        // With fusion off nothing is packed, whatever the backend.
        let fuses = (job.settings)(kolo::Config::default()).fusion_threshold > 0;
        let failure = timeline::verify(&job.timeline_path(dir), job.ranks, packs && fuses).err();
        let name = format!("{}::timeline_file_holds_the_events", job.name);
        verdicts.push(Verdict::new(name, failure));
    }
    verdicts
}

/// Why `case` did not pass on all `ranks` ranks, or `None`.
fn case_failure(lines: &[CaseLine], case: &str, ranks: usize) -> Option<String> {
    let mut ok = vec![None; ranks];
    let mut failures = Vec::new();
    for line in lines.iter().filter(|l| l.case == case) {
        match (&line.outcome, ok.get_mut(line.rank)) {
            (Ok(digest), Some(slot)) => *slot = Some(*digest),
            (Ok(_), None) => failures.push(format!("unknown rank {}", line.rank)),
            (Err(why), _) => failures.push(format!("rank {}: {why}", line.rank)),
        }
    }
    if !failures.is_empty() {
        return Some(failures.join("\n"));
    }
    let missing: Vec<usize> = (0..ranks).filter(|&r| ok[r].is_none()).collect();
    if !missing.is_empty() {
        return Some(format!("ranks {missing:?} did not report the case"));
    }
    let digests: Vec<Digest> = ok.into_iter().flatten().collect();
    (!digests.windows(2).all(|w| w[0] == w[1]))
        .then(|| format!("the ranks' results differ: digests {digests:x?}"))
}

/// Whether jobs `a` and `b` (name, lines) reached the same results: every
/// digest of a case both report agrees (per case and rank), and there is
/// at least one. The cache, fusion and the thread level change how results
/// are reached, never the results.
pub fn compare_digests(a: (&str, &[CaseLine]), b: (&str, &[CaseLine])) -> Verdict {
    let digests = |lines: &[CaseLine]| -> BTreeMap<(String, usize), u64> {
        lines
            .iter()
            .filter_map(|l| match l.outcome {
                Ok(Some(d)) => Some(((l.case.clone(), l.rank), d)),
                _ => None,
            })
            .collect()
    };
    let (da, db) = (digests(a.1), digests(b.1));
    let shared: Vec<_> = da.keys().filter(|k| db.contains_key(*k)).collect();
    let differing: Vec<String> = shared
        .iter()
        .filter(|k| da[**k] != db[**k])
        .map(|(case, rank)| format!("{case} on rank {rank}"))
        .collect();
    let failure = if shared.is_empty() {
        Some(format!("{} and {} share no result digest", a.0, b.0))
    } else if !differing.is_empty() {
        Some(format!("results differ: {}", differing.join(", ")))
    } else {
        None
    };
    Verdict::new(format!("{}::results_identical_to_{}", b.0, a.0), failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(case: &str, rank: usize, outcome: Result<Digest, String>) -> CaseLine {
        CaseLine {
            case: case.into(),
            rank,
            outcome,
        }
    }

    #[test]
    fn lines_round_trip_through_text() {
        for l in [
            line("a", 0, Ok(None)),
            line("b", 3, Ok(Some(0xfeed))),
            line("c", 1, Err("panic: x != y".into())),
        ] {
            assert_eq!(CaseLine::parse(&l.to_string()), Some(l));
        }
        let multi = line("d", 0, Err("one\ntwo".into()));
        assert_eq!(
            CaseLine::parse(&multi.to_string()).map(|l| l.outcome),
            Some(Err("one | two".into()))
        );
        assert_eq!(CaseLine::parse("something else"), None);
    }

    #[test]
    fn a_case_passes_only_when_every_rank_agrees() {
        let ok = [line("x", 0, Ok(Some(1))), line("x", 1, Ok(Some(1)))];
        assert_eq!(case_failure(&ok, "x", 2), None);
        let missing = case_failure(&ok[..1], "x", 2).unwrap();
        assert!(missing.contains("[1]"), "{missing}");
        let differ = [line("x", 0, Ok(Some(1))), line("x", 1, Ok(Some(2)))];
        assert!(case_failure(&differ, "x", 2).is_some());
        let failed = [line("x", 0, Ok(None)), line("x", 1, Err("boom".into()))];
        assert!(case_failure(&failed, "x", 2)
            .unwrap()
            .contains("rank 1: boom"));
    }

    #[test]
    fn digests_are_compared_per_case_and_rank() {
        let a = [line("w", 0, Ok(Some(5))), line("o", 0, Ok(None))];
        let same = [line("w", 0, Ok(Some(5)))];
        let other = [line("w", 0, Ok(Some(6)))];
        assert_eq!(compare_digests(("a", &a), ("b", &same)).failure, None);
        assert!(compare_digests(("a", &a), ("b", &other)).failure.is_some());
        assert!(compare_digests(("a", &a[1..]), ("b", &same))
            .failure
            .is_some());
    }
}
