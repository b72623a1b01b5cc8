//! `cargo xtask bench`: the benchmark sweeps behind docs/PERFORMANCE.md.
//!
//! `cargo xtask bench <sweep> [options]` builds kolo-bench in release mode,
//! runs the sweep (interleaved repetitions, medians and ratios), prints
//! its summary and keeps the raw output under `target/bench/<sweep>/` or
//! the folder `--out` names. `cargo xtask bench` alone lists the sweeps;
//! `cargo xtask bench run ARGS` runs kolo-bench with ARGS.

mod engine;
mod engine_ab;
mod engine_floor;
mod flags;
mod mpi;
mod plain_async;
mod runner;
mod stats;
mod threads_vs_mpi;
mod ucx_vs_mpi;

use crate::cargo;
use anyhow::{bail, Result};
use flags::{Flag, Flags};
use std::path::{Path, PathBuf};

/// One sweep: its subcommand, a line about it, its options, and the code
/// that runs it (given the workspace root, the options and the output
/// folder).
pub(crate) struct Sweep {
    pub name: &'static str,
    pub about: &'static str,
    pub flags: &'static [Flag],
    pub run: fn(&Path, &Flags, PathBuf) -> Result<()>,
}

const SWEEPS: &[Sweep] = &[
    engine::SWEEP,
    engine_floor::SWEEP,
    engine_ab::SWEEP,
    mpi::SWEEP,
    plain_async::SWEEP,
    threads_vs_mpi::SWEEP,
    ucx_vs_mpi::SWEEP,
];

fn is_help(arg: &str) -> bool {
    matches!(arg, "--help" | "-h" | "help")
}

pub(crate) fn bench(root: &Path, args: &[String]) -> Result<()> {
    let Some(name) = args.first() else {
        print!("{}", usage());
        return Ok(());
    };
    let rest = &args[1..];
    if is_help(name) {
        print!("{}", usage());
        return Ok(());
    }
    if name == "run" {
        let mut cargo_args = vec!["run", "--release", "-p", "kolo-bench", "--"];
        cargo_args.extend(rest.iter().map(String::as_str));
        return cargo(root, &cargo_args);
    }
    let Some(sweep) = SWEEPS.iter().find(|s| s.name == name) else {
        bail!("unknown sweep {name:?}\n\n{}", usage());
    };
    if rest.iter().any(|a| is_help(a)) {
        print!("{}", sweep_usage(sweep));
        return Ok(());
    }
    let flags = Flags::parse(sweep.name, rest, sweep.flags)?;
    let out = match flags.path("--out") {
        Some(dir) => dir,
        None => runner::target_dir(root)?.join("bench").join(sweep.name),
    };
    (sweep.run)(root, &flags, out)
}

fn usage() -> String {
    let width = SWEEPS.iter().map(|s| s.name.len()).max().unwrap_or(0);
    let mut text = String::from(
        "usage: cargo xtask bench <sweep> [options]   run a sweep (--help: its options)\n       \
         cargo xtask bench run [kolo-bench args]   run kolo-bench itself (release)\n\n\
         Each sweep builds kolo-bench in release mode, prints its summary and keeps the\n\
         raw output under target/bench/<sweep>/ (or --out DIR). Sweeps:\n",
    );
    for sweep in SWEEPS {
        text.push_str(&format!("  {:width$}  {}\n", sweep.name, sweep.about));
    }
    text
}

fn sweep_usage(sweep: &Sweep) -> String {
    format!(
        "usage: cargo xtask bench {} [options]\n\n{}\n\noptions:\n{}\n",
        sweep.name,
        sweep.about,
        flags::help(sweep.flags)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sweep_is_listed_with_out_among_its_options() {
        let text = usage();
        for sweep in SWEEPS {
            assert!(text.contains(&format!("  {}", sweep.name)), "{text}");
            assert!(
                sweep.flags.iter().any(|f| f.name == "--out"),
                "{}",
                sweep.name
            );
            assert!(sweep_usage(sweep).contains("--out DIR"));
        }
        let mut names: Vec<_> = SWEEPS.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), SWEEPS.len());
    }

    #[test]
    fn an_unknown_sweep_lists_the_known_ones() {
        let err = bench(Path::new("."), &["enigne".to_string()]).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("unknown sweep \"enigne\""), "{text}");
        assert!(text.contains("engine-floor"), "{text}");
    }
}
