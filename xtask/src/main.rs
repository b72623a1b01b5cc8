//! `cargo xtask`: kolo's developer commands.
//!
//! - `cargo xtask test`: formatting, clippy, then every test of the workspace
//!   (what CI runs).
//! - `cargo xtask ci`: the same as `test`.
//! - `cargo xtask bench`: the benchmark sweeps recorded in docs/PERFORMANCE.md.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    match args.first().map(String::as_str) {
        Some("test") | Some("ci") => test(&root),
        Some("bench") => bench(&root, &args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <test|ci|bench>");
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
fn cargo(root: &Path, args: &[&str]) -> Result<()> {
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
    cargo(root, &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    cargo(root, &["test", "--workspace"])?;
    Ok(())
}

fn bench(root: &Path, extra: &[String]) -> Result<()> {
    let mut args = vec!["run", "--release", "-p", "kolo-bench", "--"];
    args.extend(extra.iter().map(String::as_str));
    cargo(root, &args)
}
