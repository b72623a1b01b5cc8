//! `cargo xtask soak [--seconds S]`: kolo-bench's `kolo-soak` (random
//! operations through the engine, every result checked, resident memory
//! sampled) on 8 thread ranks, then on 4 UCX processes under kolo-run,
//! each for S seconds (default 60). `cargo xtask test` runs 30 seconds of
//! each with the binaries its test build made.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// Runs both soaks with the binaries in `bin` for `seconds` each.
pub(crate) fn soak(bin: &Path, seconds: u64) -> Result<()> {
    let soak = bin.join("kolo-soak");
    let secs = seconds.to_string();
    let runs: [(&str, Vec<String>, &Path); 2] = [
        (
            "8 thread ranks",
            vec![
                "--ranks".into(),
                "8".into(),
                "--seconds".into(),
                secs.clone(),
            ],
            &soak,
        ),
        (
            "4 UCX processes",
            vec![
                "-n".into(),
                "4".into(),
                "--master-port".into(),
                "0".into(),
                soak.to_string_lossy().into_owned(),
                "--seconds".into(),
                secs,
            ],
            &bin.join("kolo-run"),
        ),
    ];
    for (what, args, program) in runs {
        eprintln!(
            "xtask: soak, {what}: {} {}",
            program.display(),
            args.join(" ")
        );
        let status = Command::new(program)
            .args(&args)
            .env("UCX_TLS", "sm,self")
            .env("KOLO_LOG_LEVEL", "error")
            .status()
            .with_context(|| format!("running {}", program.display()))?;
        if !status.success() {
            bail!("the soak on {what} failed ({status})");
        }
    }
    Ok(())
}

/// `cargo xtask soak [--seconds S]`: release binaries, S seconds each.
pub(crate) fn soak_command(root: &Path, args: &[String]) -> Result<()> {
    let seconds = match args.first().map(String::as_str) {
        None => 60,
        Some("--seconds") => args
            .get(1)
            .and_then(|v| v.parse().ok())
            .context("--seconds takes a number")?,
        Some(other) => bail!("usage: cargo xtask soak [--seconds S], not {other}"),
    };
    crate::cargo(
        root,
        &[
            "build",
            "--release",
            "-p",
            "kolo-bench",
            "-p",
            "kolo-run",
            "--features",
            "kolo-bench/ucx",
        ],
    )?;
    soak(&root.join("target/release"), seconds)
}
