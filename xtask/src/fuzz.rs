//! `cargo xtask fuzz`: kolo's cargo-fuzz targets (`fuzz/`), each for a
//! bounded time or number of runs, with libFuzzer and AddressSanitizer.
//! cargo-fuzz is installed when missing; its `-Z` flags are accepted by the
//! stable compiler through `RUSTC_BOOTSTRAP=1`, so no nightly toolchain is
//! needed (none can be fetched here).

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// The targets, named as in `fuzz/Cargo.toml`.
pub(crate) const TARGETS: [&str; 3] = ["wire_codec", "rendezvous_protocol", "capi_descriptor"];

/// How long a run of one target may go on.
pub(crate) enum Bound {
    /// At most this many seconds.
    Seconds(u64),
    /// Exactly this many executions.
    Runs(u64),
}

/// Installs cargo-fuzz if `cargo fuzz` is missing.
fn ensure_cargo_fuzz(root: &Path) -> Result<()> {
    let present = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !present {
        crate::cargo(root, &["install", "--locked", "cargo-fuzz"])?;
    }
    Ok(())
}

/// Runs every target within `bound`; a crash fails with the target's name
/// (its input is left in `fuzz/artifacts/<target>/`).
pub(crate) fn fuzz(root: &Path, bound: &Bound) -> Result<()> {
    ensure_cargo_fuzz(root)?;
    let fuzz_dir = root.join("fuzz");
    for target in TARGETS {
        let corpus = fuzz_dir.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .with_context(|| format!("creating {}", corpus.display()))?;
        let limit = match bound {
            Bound::Seconds(s) => format!("-max_total_time={s}"),
            Bound::Runs(n) => format!("-runs={n}"),
        };
        let args = [
            "fuzz",
            "run",
            target,
            "--",
            &limit,
            "-rss_limit_mb=4096",
            "-print_final_stats=1",
        ];
        eprintln!("xtask: cargo {}", args.join(" "));
        let status = Command::new("cargo")
            .args(args)
            .env("RUSTC_BOOTSTRAP", "1")
            .current_dir(&fuzz_dir)
            .status()
            .with_context(|| format!("running cargo fuzz run {target}"))?;
        if !status.success() {
            bail!("fuzz target {target} failed ({status}): see fuzz/artifacts/{target}/");
        }
    }
    Ok(())
}

/// `cargo xtask fuzz [--seconds S | --runs N]` (default: 60 seconds each).
pub(crate) fn fuzz_command(root: &Path, args: &[String]) -> Result<()> {
    let value = |i: usize| -> Result<u64> {
        args.get(i + 1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{} takes a number", args[i]))
    };
    let bound = match args.first().map(String::as_str) {
        None => Bound::Seconds(60),
        Some("--seconds") => Bound::Seconds(value(0)?),
        Some("--runs") => Bound::Runs(value(0)?),
        Some(other) => bail!("usage: cargo xtask fuzz [--seconds S | --runs N], not {other}"),
    };
    fuzz(root, &bound)
}
