//! `cargo xtask bench engine-floor`: the engine's step next to the
//! machine's memory floor, interleaved round by round. `memory-floor` is
//! the least memory traffic an in-place allreduce of 2 thread ranks moves
//! for the same 4,096,000 bytes, with no library around it, in runs of
//! 4 KiB as kolo-threads cuts 1,000 tensors of 4 KiB; beside it the step
//! as one grouped call in a `Kolo::scope` and as one `kolo::TensorGroup`,
//! each fused and with `--fusion-threshold 0`. The ceiling of the fusion
//! ratio is the unfused step over the floor: a fused step at the floor.

use super::engine::{step_args, ITERS, STEP_BYTES, UNFUSED, WARMUP};
use super::flags::{Flag, Flags, NO_RT, OUT};
use super::runner::{build_kolo_bench, row_value, time_us, Binaries, Session};
use super::stats::{median, median_ratio, ratios, reaching};
use super::Sweep;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

pub(crate) const SWEEP: Sweep = Sweep {
    name: "engine-floor",
    about: "the 1,000 x 4 KiB step (scoped group, TensorGroup) beside memory-floor, interleaved",
    flags: &[
        Flag {
            name: "--rounds",
            value: Some("N"),
            help: "interleaved rounds (default 12)",
        },
        ITERS,
        WARMUP,
        Flag {
            name: "--bin-dir",
            value: Some("DIR"),
            help: "a folder with kolo-bench and memory-floor (default: build this tree's)",
        },
        NO_RT,
        OUT,
    ],
    run,
};

/// The fusion ratio kolo aims for: the fused step 10x the unfused one.
const TARGET_RATIO: f64 = 10.0;

/// One round: floor, then the scoped group and the tensor group, each
/// fused and unfused (µs).
#[derive(Clone, Copy, Debug, Default)]
struct Round {
    floor: f64,
    grouped: (f64, f64),
    group: (f64, f64),
}

fn run(root: &Path, flags: &Flags, out: PathBuf) -> Result<()> {
    let rounds = flags.count("--rounds", 12)?;
    let iters = flags.count("--iters", 40)?;
    let warmup: usize = flags.value("--warmup", 5)?;
    let bins = match flags.path("--bin-dir") {
        Some(dir) => Binaries {
            kolo_bench: dir.join("kolo-bench"),
            memory_floor: dir.join("memory-floor"),
        },
        None => build_kolo_bench(root, &[])?,
    };
    let mut session = Session::open(out, !flags.switch("--no-rt"))?;
    session
        .say("# round: floor, grouped fused, grouped unfused, group fused, group unfused (us)")?;
    let floor_args: Vec<String> = [
        "--bytes",
        "4000K",
        "--run",
        "4K",
        "--iters",
        &iters.to_string(),
        "--warmup",
        &warmup.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut all = Vec::new();
    for round in 1..=rounds {
        let floor_out = session.capture(&bins.memory_floor, &floor_args)?;
        let floor = row_value(&floor_out, STEP_BYTES, 1)
            .with_context(|| format!("memory-floor printed no row of {STEP_BYTES} B"))?;
        let mut step = |extra: &[&str]| -> Result<(f64, f64)> {
            let fused = step_args(iters, warmup, extra);
            let mut unfused = fused.clone();
            unfused.extend(UNFUSED.iter().map(|s| s.to_string()));
            let f = time_us(
                &session.capture(&bins.kolo_bench, &fused)?,
                STEP_BYTES,
                "kolo-bench",
            )?;
            let u = time_us(
                &session.capture(&bins.kolo_bench, &unfused)?,
                STEP_BYTES,
                "kolo-bench",
            )?;
            Ok((f, u))
        };
        let grouped = step(&["--grouped"])?;
        let group = step(&["--tensor-group"])?;
        let r = Round {
            floor,
            grouped,
            group,
        };
        session.say(&format!(
            "{round} {:.1} {:.1} {:.1} {:.1} {:.1}",
            r.floor, r.grouped.0, r.grouped.1, r.group.0, r.group.1
        ))?;
        all.push(r);
    }
    session.finish(&summary(&all))
}

fn summary(rounds: &[Round]) -> String {
    let floor: Vec<f64> = rounds.iter().map(|r| r.floor).collect();
    let column = |pick: fn(&Round) -> f64| -> Vec<f64> { rounds.iter().map(pick).collect() };
    let grouped = (column(|r| r.grouped.0), column(|r| r.grouped.1));
    let group = (column(|r| r.group.0), column(|r| r.group.1));
    let mut lines = vec![format!(
        "medians of {} rounds: floor {:.0} us; grouped in a scope: fused {:.0} us, unfused {:.0} us; \
         TensorGroup: fused {:.0} us, unfused {:.0} us",
        rounds.len(),
        median(&floor),
        median(&grouped.0),
        median(&grouped.1),
        median(&group.0),
        median(&group.1)
    )];
    for (what, (fused, unfused)) in [("grouped in a scope", &grouped), ("TensorGroup", &group)] {
        let r = ratios(fused, unfused);
        lines.push(format!(
            "{what}: fused/unfused {:.2}x (median of rounds; {} of {} rounds at {TARGET_RATIO}x or more), \
             fused step over the floor {:.2}x",
            median(&r),
            reaching(&r, TARGET_RATIO),
            r.len(),
            median_ratio(&floor, fused)
        ));
    }
    lines.push(format!(
        "ceiling (grouped unfused / floor): {:.2}x",
        median_ratio(&floor, &grouped.1)
    ));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_gives_ratios_and_the_ceiling() {
        let round = |floor, f| Round {
            floor,
            grouped: (f, 3000.0),
            group: (f, 2000.0),
        };
        let text = summary(&[
            round(200.0, 300.0),
            round(200.0, 250.0),
            round(250.0, 250.0),
        ]);
        assert!(
            text.starts_with("medians of 3 rounds: floor 200 us"),
            "{text}"
        );
        assert!(text.contains("grouped in a scope: fused/unfused 12.00x (median of rounds; 3 of 3"));
        assert!(text.contains("TensorGroup: fused/unfused 8.00x (median of rounds; 0 of 3"));
        assert!(text.contains("fused step over the floor 1.25x"));
        assert!(
            text.ends_with("ceiling (grouped unfused / floor): 15.00x"),
            "{text}"
        );
    }
}
