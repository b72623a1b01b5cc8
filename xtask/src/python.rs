//! The `kolo` Python package in `cargo xtask test`: a virtual environment
//! under `target/` (maturin, numpy, pytest, and torch unless
//! `KOLO_TEST_TORCH=0`), the wheel built by maturin with the workspace's
//! target directory (so it shares the test build's compiled crates), and
//! pytest over `python/tests` (the numpy API, kolo.torch, the "kolo"
//! torch.distributed backend and the examples, at 2 and 3 processes).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `program args` in `root`, failing with the command line.
fn run(root: &Path, program: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    eprintln!("xtask: {} {}", program.display(), args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root)
        .status()
        .with_context(|| format!("running {}", program.display()))?;
    if !status.success() {
        bail!("{} {} failed ({status})", program.display(), args.join(" "));
    }
    Ok(())
}

/// The virtual environment's Python, made (and its packages installed)
/// when missing; torch only where `torch` asks.
pub(crate) fn venv(root: &Path, torch: bool) -> Result<PathBuf> {
    let dir = root.join("target/python-venv");
    let python = dir.join("bin/python");
    if !python.exists() {
        let dir_arg = dir.to_string_lossy().into_owned();
        run(root, Path::new("python3"), &["-m", "venv", &dir_arg], &[])?;
    }
    let mut packages = vec!["maturin>=1.5,<2", "numpy>=1.23", "pytest>=7"];
    if torch {
        packages.push("torch>=2.1");
    }
    // No download cache: torch's CUDA wheels are gigabytes, installed once
    // per venv, and a cached second copy once filled the CI machine's disk.
    let mut args = vec![
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-cache-dir",
    ];
    args.extend(packages);
    run(root, &python, &args, &[])?;
    Ok(python)
}

/// Builds the wheel with `profile` into `out` (emptied first); its path.
pub(crate) fn wheel(root: &Path, python: &Path, profile: &str, out: &Path) -> Result<PathBuf> {
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))?;
    }
    let maturin = python.with_file_name("maturin");
    let out_arg = out.to_string_lossy().into_owned();
    let python_arg = python.to_string_lossy().into_owned();
    run(
        root,
        &maturin,
        &[
            "build",
            "--profile",
            profile,
            "-m",
            "python/Cargo.toml",
            "-i",
            &python_arg,
            "-o",
            &out_arg,
        ],
        &[],
    )?;
    std::fs::read_dir(out)
        .with_context(|| format!("reading {}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("no wheel in {}", out.display()))
}

/// The Python package's tests (see the module's doc).
pub(crate) fn test_python(root: &Path) -> Result<()> {
    let torch = std::env::var("KOLO_TEST_TORCH").map_or(true, |v| v != "0");
    let python = venv(root, torch)?;
    let wheel = wheel(root, &python, "dev", &root.join("target/wheels/dev"))?;
    let wheel_arg = wheel.to_string_lossy().into_owned();
    run(
        root,
        &python,
        &[
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--force-reinstall",
            &wheel_arg,
        ],
        &[],
    )?;
    // From python/tests, so that the installed package (not the source
    // folder python/kolo, which lacks the native module) is imported.
    run(
        &root.join("python/tests"),
        &python,
        &["-m", "pytest", "-q", "-p", "no:cacheprovider", "."],
        &[("OMP_NUM_THREADS", "1")],
    )
}

/// Puts the Python package in `dist` for a GPU host without network: the
/// release wheel and pytest's wheels in `wheels/`, the tests, examples
/// and benchmark beside them (run by `run-python.sh`); their size.
pub(crate) fn gpu_dist(root: &Path, dist: &Path) -> Result<u64> {
    let python = venv(root, false)?;
    let wheels = dist.join("wheels");
    wheel(root, &python, "release", &wheels)?;
    let wheels_arg = wheels.to_string_lossy().into_owned();
    run(
        root,
        &python,
        &[
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "-d",
            &wheels_arg,
            "pytest>=7",
        ],
        &[],
    )?;
    for (from, to) in [
        ("python/tests", "python/tests"),
        ("python/examples", "python/examples"),
        ("benches/python", "benches/python"),
    ] {
        copy_tree(&root.join(from), &dist.join(to))?;
    }
    let mut total = 0;
    for part in ["wheels", "python", "benches"] {
        for file in walk(&dist.join(part))? {
            total += std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        }
    }
    Ok(total)
}

/// Copies the files of `from` (recursively, skipping `__pycache__`) to `to`.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default();
        if name == "__pycache__" {
            continue;
        }
        if path.is_dir() {
            copy_tree(&path, &to.join(name))?;
        } else {
            std::fs::copy(&path, to.join(name))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(walk(&path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}
