//! `cargo xtask bench engine`: the engine's fusion and latency numbers in
//! one run. 1,000 tensors of 4 KiB per step through the engine on 2 thread
//! ranks, fused and with `--fusion-threshold 0`, for each way of
//! submitting them, then the 4-byte allreduce through the engine; all of
//! it repeated and interleaved, so that the machine's drift hits every
//! variant alike.

use super::flags::{Flag, Flags, NO_RT, OUT};
use super::runner::{build_kolo_bench, time_us, Session};
use super::stats::median;
use super::Sweep;
use anyhow::Result;
use std::path::{Path, PathBuf};

pub(crate) const SWEEP: Sweep = Sweep {
    name: "engine",
    about:
        "1,000 x 4 KiB per step, every submission style, fused and unfused; the 4-byte allreduce",
    flags: &[
        Flag {
            name: "--reps",
            value: Some("N"),
            help: "interleaved repetitions of the whole set (default 3)",
        },
        ITERS,
        WARMUP,
        Flag {
            name: "--bench",
            value: Some("PATH"),
            help: "a kolo-bench binary to run (default: build this tree's)",
        },
        NO_RT,
        OUT,
    ],
    run,
};

/// `--iters`, shared by the engine sweeps.
pub(crate) const ITERS: Flag = Flag {
    name: "--iters",
    value: Some("N"),
    help: "timed steps per run (default 40)",
};

/// `--warmup`, shared by the engine sweeps.
pub(crate) const WARMUP: Flag = Flag {
    name: "--warmup",
    value: Some("N"),
    help: "untimed steps before them (default 5)",
};

/// The bytes of one step: 1,000 tensors of 1,024 f32.
pub(crate) const STEP_BYTES: usize = 4_096_000;

/// kolo-bench's arguments for one engine step of 1,000 x 4 KiB, then
/// `extra`.
pub(crate) fn step_args(iters: usize, warmup: usize, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--engine",
        "--op",
        "allreduce",
        "--tensors",
        "1000",
        "--min-bytes",
        "4000K",
        "--max-bytes",
        "4000K",
        "--iters",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(iters.to_string());
    args.push("--warmup".into());
    args.push(warmup.to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// `--fusion-threshold 0`: every tensor its own collective.
pub(crate) const UNFUSED: &[&str] = &["--fusion-threshold", "0"];

/// The ways of submitting a step: kolo-bench's flags and what they mean.
const MODES: &[(&[&str], &str)] = &[
    (&[], "1,000 `allreduce_async` in a scope"),
    (
        &["--grouped"],
        "one `TensorGroup`, `allreduce_group_async` in a scope",
    ),
    (
        &["--tensor-group"],
        "one `TensorGroup`, blocking `allreduce_group`",
    ),
];

/// The 4-byte allreduce runs this many times the step's iterations (a
/// step takes about that much longer).
const SMALL_ITERS_PER_STEP: usize = 75;

fn run(root: &Path, flags: &Flags, out: PathBuf) -> Result<()> {
    let reps = flags.count("--reps", 3)?;
    let iters = flags.count("--iters", 40)?;
    let warmup = flags.value("--warmup", 5)?;
    let bench = match flags.path("--bench") {
        Some(path) => path,
        None => build_kolo_bench(root, &[])?.kolo_bench,
    };
    let mut session = Session::open(out, !flags.switch("--no-rt"))?;
    // times[mode] = (fused, unfused), one value per repetition.
    let mut times = vec![(Vec::new(), Vec::new()); MODES.len()];
    let mut small = Vec::new();
    for rep in 1..=reps {
        for (mode, (extra, _)) in MODES.iter().enumerate() {
            for unfused in [false, true] {
                let mut args = step_args(iters, warmup, extra);
                if unfused {
                    args.extend(UNFUSED.iter().map(|s| s.to_string()));
                }
                let us = time_us(&session.capture(&bench, &args)?, STEP_BYTES, "kolo-bench")?;
                let label = if unfused { "unfused" } else { "fused" };
                let flags = if extra.is_empty() {
                    "separate".to_string()
                } else {
                    extra.join(" ")
                };
                session.say(&format!("{rep} | {flags} | {label} | {us:.2} us"))?;
                let (fused_times, unfused_times) = &mut times[mode];
                if unfused { unfused_times } else { fused_times }.push(us);
            }
        }
        let args: Vec<String> = [
            "--engine",
            "--op",
            "allreduce",
            "--min-bytes",
            "4",
            "--max-bytes",
            "4",
            "--iters",
            &(iters * SMALL_ITERS_PER_STEP).to_string(),
            "--warmup",
            "200",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let us = time_us(&session.capture(&bench, &args)?, 4, "kolo-bench")?;
        session.say(&format!("{rep} | 4-byte allreduce | | {us:.2} us"))?;
        small.push(us);
    }
    session.finish(&summary(&times, &small, reps, iters))
}

fn summary(times: &[(Vec<f64>, Vec<f64>)], small: &[f64], reps: usize, iters: usize) -> String {
    let mut lines = vec![
        format!(
            "1,000 x 4 KiB per step, 2 thread ranks; each cell the median of {reps} \
             repetition(s), each the median of {iters} steps"
        ),
        String::new(),
        "| submission | kolo-bench flags | fused (us) | `--fusion-threshold 0` (us) | ratio |"
            .to_string(),
        "|---|---|---|---|---|".to_string(),
    ];
    for ((extra, what), (fused, unfused)) in MODES.iter().zip(times) {
        let (f, u) = (median(fused), median(unfused));
        let shown = if extra.is_empty() {
            "(none)".to_string()
        } else {
            format!("`{}`", extra.join(" "))
        };
        lines.push(format!(
            "| {what} | {shown} | {f:.0} | {u:.0} | {:.2}x |",
            u / f
        ));
    }
    lines.push(String::new());
    lines.push(format!(
        "4-byte allreduce through the engine: {:.2} us (median of {reps} repetition(s))",
        median(small)
    ));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_is_one_thousand_tensors_of_4_kib() {
        let args = step_args(40, 5, &["--grouped"]);
        let text = args.join(" ");
        assert!(text.contains("--tensors 1000 --min-bytes 4000K --max-bytes 4000K"));
        assert!(text.ends_with("--iters 40 --warmup 5 --grouped"));
        // kolo-bench prints the step's row under its byte count.
        assert_eq!(4000 * 1024, STEP_BYTES);
    }

    #[test]
    fn summary_has_a_row_per_submission_style() {
        let times = vec![(vec![100.0, 300.0], vec![1000.0, 1000.0]); MODES.len()];
        let text = summary(&times, &[6.0, 8.0], 2, 40);
        assert_eq!(text.matches("| 200 | 1000 | 5.00x |").count(), MODES.len());
        assert!(text
            .contains("| one `TensorGroup`, `allreduce_group_async` in a scope | `--grouped` |"));
        assert!(
            text.ends_with("7.00 us (median of 2 repetition(s))"),
            "{text}"
        );
    }
}
