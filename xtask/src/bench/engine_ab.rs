//! `cargo xtask bench engine-ab`: two kolo-bench builds compared in the
//! same run, on the step of 1,000 x 4 KiB as one grouped call in a
//! `Kolo::scope`, fused and with `--fusion-threshold 0`; the four runs
//! interleaved round by round, so that a change of the machine's speed
//! falls on both builds alike. A base build comes from a worktree:
//! `git worktree add /tmp/base <commit>` and
//! `cargo build --release -p kolo-bench --manifest-path /tmp/base/Cargo.toml`.

use super::engine::{step_args, ITERS, STEP_BYTES, UNFUSED, WARMUP};
use super::flags::{Flag, Flags, NO_RT, OUT};
use super::runner::{build_kolo_bench, time_us, Session};
use super::stats::{median, median_ratio, ratios};
use super::Sweep;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

pub(crate) const SWEEP: Sweep = Sweep {
    name: "engine-ab",
    about: "two kolo-bench builds on the scoped grouped step, fused and unfused, interleaved",
    flags: &[
        Flag {
            name: "--base",
            value: Some("PATH"),
            help: "the base build's kolo-bench binary (required)",
        },
        Flag {
            name: "--new",
            value: Some("PATH"),
            help: "the new build's kolo-bench binary (default: build this tree's)",
        },
        Flag {
            name: "--rounds",
            value: Some("N"),
            help: "interleaved rounds (default 20)",
        },
        ITERS,
        WARMUP,
        NO_RT,
        OUT,
    ],
    run,
};

/// One round: (fused, unfused) of the base, then of the new build (µs).
type Round = [(f64, f64); 2];

fn run(root: &Path, flags: &Flags, out: PathBuf) -> Result<()> {
    let base = flags
        .path("--base")
        .context("`cargo xtask bench engine-ab` needs --base PATH (the base build's kolo-bench)")?;
    let rounds = flags.count("--rounds", 20)?;
    let iters = flags.count("--iters", 40)?;
    let warmup: usize = flags.value("--warmup", 5)?;
    let new = match flags.path("--new") {
        Some(path) => path,
        None => build_kolo_bench(root, &[])?.kolo_bench,
    };
    let mut session = Session::open(out, !flags.switch("--no-rt"))?;
    session.say(&format!("# base: {}", base.display()))?;
    session.say(&format!("# new:  {}", new.display()))?;
    session.say("# round: base fused, base unfused, new fused, new unfused (us)")?;
    let fused = step_args(iters, warmup, &["--grouped"]);
    let mut unfused = fused.clone();
    unfused.extend(UNFUSED.iter().map(|s| s.to_string()));
    let mut all: Vec<Round> = Vec::new();
    for round in 1..=rounds {
        let mut pair = |bin: &Path| -> Result<(f64, f64)> {
            let f = time_us(&session.capture(bin, &fused)?, STEP_BYTES, "kolo-bench")?;
            let u = time_us(&session.capture(bin, &unfused)?, STEP_BYTES, "kolo-bench")?;
            Ok((f, u))
        };
        let r = [pair(&base)?, pair(&new)?];
        session.say(&format!(
            "{round} {:.1} {:.1} {:.1} {:.1}",
            r[0].0, r[0].1, r[1].0, r[1].1
        ))?;
        all.push(r);
    }
    session.finish(&summary(&all))
}

fn summary(rounds: &[Round]) -> String {
    let column = |build: usize, unfused: bool| -> Vec<f64> {
        rounds
            .iter()
            .map(|r| if unfused { r[build].1 } else { r[build].0 })
            .collect()
    };
    let mut lines = Vec::new();
    for (build, name) in [(0, "base:"), (1, "new:")] {
        let (f, u) = (column(build, false), column(build, true));
        lines.push(format!(
            "{name:<5} fused {:.0} us, unfused {:.0} us, fused/unfused {:.2}x (median of {} rounds)",
            median(&f),
            median(&u),
            median_ratio(&f, &u),
            rounds.len()
        ));
    }
    let mut sorted = ratios(&column(1, false), &column(1, true));
    sorted.sort_by(f64::total_cmp);
    let sorted: Vec<String> = sorted.iter().map(|r| format!("{r:.2}")).collect();
    lines.push(format!("new ratios, sorted: {}", sorted.join(" ")));
    lines.push(format!(
        "new fused step vs base fused step: {:.2}x faster (median of rounds)",
        median_ratio(&column(1, false), &column(0, false))
    ));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_compares_the_builds_round_by_round() {
        let rounds = [
            [(400.0, 4000.0), (200.0, 3000.0)],
            [(500.0, 4000.0), (250.0, 2000.0)],
            [(600.0, 4000.0), (400.0, 4000.0)],
        ];
        let text = summary(&rounds);
        assert!(text.starts_with("base: fused 500 us, unfused 4000 us, fused/unfused 8.00x"));
        assert!(text.contains("new:  fused 250 us, unfused 3000 us, fused/unfused 10.00x"));
        assert!(text.contains("new ratios, sorted: 8.00 10.00 15.00"));
        assert!(text.ends_with("2.00x faster (median of rounds)"), "{text}");
    }
}
