//! `cargo xtask`: kolo's developer commands.
//!
//! - `cargo xtask test`: installs what the tests need (scripts/install-deps.sh),
//!   formatting, clippy with every feature, every test of the workspace with
//!   every feature (the MPI ones under a real mpirun), the Python package's
//!   pytest suite against its wheel (`python/tests`), and a check of the
//!   facade's default build (what CI runs).
//! - `cargo xtask ci`: the same as `test`.
//! - `cargo xtask test-python`: only the Python package's part of `test`.
//! - `cargo xtask fuzz [--seconds S | --runs N]`: the cargo-fuzz targets of
//!   `fuzz/` (20 seconds each run in `test`).
//! - `cargo xtask soak [--seconds S]`: random checked operations through
//!   the engine on 8 thread ranks and 4 UCX processes (30 seconds each in
//!   `test`).
//! - `cargo xtask bench`: the benchmark sweeps recorded in docs/PERFORMANCE.md.
//! - `cargo xtask test-gpu`: kolo-nccl's GPU checks, kolo's GPU engine checks,
//!   kolo-pipeline's NCCL checks and kolo-bench, built into `gpu-dist/` with
//!   a `run.sh`, a `run-engine.sh` and a `run-pipeline.sh`; run here when a
//!   GPU is present.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

mod bench;
mod fuzz;
mod gpu;
mod python;
mod soak;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    match args.first().map(String::as_str) {
        Some("test") | Some("ci") => test(&root),
        Some("bench") => bench::bench(&root, &args[1..]),
        Some("test-gpu") => gpu::test_gpu(&root),
        Some("test-python") => python::test_python(&root),
        Some("fuzz") => fuzz::fuzz_command(&root, &args[1..]),
        Some("soak") => soak::soak_command(&root, &args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <test|ci|bench|test-gpu|test-python|fuzz|soak>");
            std::process::exit(2);
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Runs `cargo` with `args` in `root`, failing with the command line.
pub(crate) fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Installs the system packages the tests need (OpenMPI, libclang) when
/// missing, so that `cargo xtask test` works on a fresh machine.
fn install_deps(root: &Path) -> Result<()> {
    let script = root.join("scripts/install-deps.sh");
    eprintln!("xtask: bash {}", script.display());
    let status = Command::new("bash")
        .arg(&script)
        .current_dir(root)
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        bail!("{} failed ({status})", script.display());
    }
    Ok(())
}

fn test(root: &Path) -> Result<()> {
    install_deps(root)?;
    cargo(root, &["fmt", "--all", "--check"])?;
    cargo(
        root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // Every feature at once: the MPI paths of kolo, kolo-bench and the
    // pipeline run under a real mpirun; the GPU binaries build and report
    // that there is no GPU (they run on GPU hosts through `test-gpu`).
    cargo(root, &["test", "--workspace", "--all-features"])?;
    // The Python package against its built wheel (numpy, torch on CPU).
    python::test_python(root)?;
    // The soak: random operations, every result checked, with the
    // binaries the test build made (kolo-soak and kolo-run).
    soak::soak(&root.join("target/debug"), 30)?;
    // A bounded run of each fuzz target (the long runs: `cargo xtask fuzz`).
    fuzz::fuzz(root, &fuzz::Bound::Seconds(20))?;
    // And the default build of the facade, which must need no system
    // library (`cargo add kolo` just works).
    cargo(root, &["check", "-p", "kolo", "--all-targets"])?;
    Ok(())
}
