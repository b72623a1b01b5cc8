//! `cargo xtask test-gpu`: the GPU checks and benchmarks, built into
//! `gpu-dist/` with the scripts of `xtask/gpu/` that run them.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `cargo xtask test-gpu`: builds the GPU test binaries (kolo-nccl's,
/// the conformance suite on device memory among them, kolo-pipeline's,
/// kolo's GPU engine checks, again with UCX for one process per GPU under
/// kolo-run), kolo-nccl's `nccl_bench`, `kolo-run` and kolo-bench in
/// release mode into `gpu-dist/` (debuginfo stripped) with
/// every file of `xtask/gpu/` (`run.sh`, `run-engine.sh`,
/// `run-pipeline.sh` and `gpu-env.sh`, the prelude the three source); runs
/// them when `nvidia-smi` works here, otherwise says how to run the folder
/// on a GPU host.
pub(crate) fn test_gpu(root: &Path) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build = |args: &[&str]| -> Result<String> {
        eprintln!("xtask: cargo {}", args.join(" "));
        let out = Command::new(&cargo)
            .args(args)
            .current_dir(root)
            .stderr(std::process::Stdio::inherit())
            .output()
            .with_context(|| format!("running cargo {}", args.join(" ")))?;
        if !out.status.success() {
            bail!("cargo {} failed ({})", args.join(" "), out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // One compiler-artifact JSON object per line: the first "name" is the
    // target's, "executable" its path (null for libraries).
    let field = |line: &str, key: &str| -> Option<String> {
        let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
        line[start..]
            .find('"')
            .map(|end| line[start..start + end].to_string())
    };
    let artifacts = |json: &str| -> Vec<(String, PathBuf)> {
        json.lines()
            .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
            .filter_map(|l| Some((field(l, "name")?, PathBuf::from(field(l, "executable")?))))
            .collect()
    };
    let tests = build(&[
        "test",
        "--release",
        "-p",
        "kolo-nccl",
        "-p",
        "kolo-pipeline",
        "--features",
        "kolo-pipeline/nccl,kolo-pipeline/mpi",
        "--no-run",
        "--message-format=json",
    ])?;
    let gpu_tests = [
        "gpu_threads",
        "gpu_mpi",
        "gpu_conformance",
        "gpu_nccl",
        "gpu_nccl_mpi",
    ];
    let mut wanted: Vec<(String, PathBuf)> = artifacts(&tests)
        .into_iter()
        .filter(|(name, _)| gpu_tests.contains(&name.as_str()))
        .collect();
    if wanted.len() != gpu_tests.len() {
        bail!("expected the {gpu_tests:?} test executables, found {wanted:?}");
    }
    // The GPU engine's checks (kolo with the `nccl` feature, and `mpi` for
    // one process per GPU under mpirun).
    let engine = build(&[
        "test",
        "--release",
        "-p",
        "kolo",
        "--features",
        "nccl,mpi",
        "--test",
        "gpu_engine",
        "--no-run",
        "--message-format=json",
    ])?;
    wanted.extend(
        artifacts(&engine)
            .into_iter()
            .filter(|(name, _)| name == "gpu_engine"),
    );
    // The same checks with one process per GPU started by kolo-run
    // (`Kolo::init_nccl_ucx`, NCCL bootstrapped through the rendezvous
    // store): a binary of its own, so that a GPU host without UCX still
    // runs the others.
    let store = build(&[
        "test",
        "--release",
        "-p",
        "kolo",
        "--features",
        "nccl,mpi,ucx",
        "--test",
        "gpu_engine",
        "--no-run",
        "--message-format=json",
    ])?;
    wanted.extend(
        artifacts(&store)
            .into_iter()
            .filter(|(name, _)| name == "gpu_engine")
            .map(|(_, exe)| ("gpu_engine_ucx".to_string(), exe)),
    );
    let launcher = build(&[
        "build",
        "--release",
        "-p",
        "kolo-run",
        "--bin",
        "kolo-run",
        "--message-format=json",
    ])?;
    wanted.extend(
        artifacts(&launcher)
            .into_iter()
            .filter(|(name, _)| name == "kolo-run"),
    );
    // kolo-nccl's timings (a bench target, built like the tests).
    let bench = build(&[
        "test",
        "--release",
        "-p",
        "kolo-nccl",
        "--bench",
        "nccl_bench",
        "--no-run",
        "--message-format=json",
    ])?;
    wanted.extend(
        artifacts(&bench)
            .into_iter()
            .filter(|(name, _)| name == "nccl_bench"),
    );
    for needed in ["gpu_engine", "gpu_engine_ucx", "kolo-run", "nccl_bench"] {
        if !wanted.iter().any(|(name, _)| name == needed) {
            bail!("cargo built no {needed} executable");
        }
    }
    match build(&[
        "build",
        "--release",
        "-p",
        "kolo-bench",
        "--message-format=json",
    ]) {
        Ok(json) => wanted.extend(
            artifacts(&json)
                .into_iter()
                .filter(|(name, _)| name == "kolo-bench"),
        ),
        Err(e) => eprintln!("xtask: warning: kolo-bench not included: {e:#}"),
    }
    let dist = root.join("gpu-dist");
    if dist.exists() {
        std::fs::remove_dir_all(&dist).with_context(|| format!("removing {}", dist.display()))?;
    }
    std::fs::create_dir_all(&dist).with_context(|| format!("creating {}", dist.display()))?;
    let mut total = 0u64;
    for (name, exe) in &wanted {
        let to = dist.join(name);
        std::fs::copy(exe, &to)
            .with_context(|| format!("copying {} to {}", exe.display(), to.display()))?;
        // Best effort: without `strip` the folder is just larger.
        let _ = Command::new("strip").arg("--strip-debug").arg(&to).status();
        total += std::fs::metadata(&to).map(|m| m.len()).unwrap_or(0);
    }
    let scripts = copy_scripts(&root.join("xtask/gpu"), &dist)?;
    total += scripts;
    total += crate::python::gpu_dist(root, &dist)?;
    eprintln!(
        "xtask: {} ({} MiB): {}",
        dist.display(),
        total >> 20,
        wanted
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if total > 60 << 20 {
        bail!(
            "gpu-dist is {} MiB, over the 60 MiB a GPU run can take",
            total >> 20
        );
    }
    let gpu_here = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !gpu_here {
        eprintln!(
            "xtask: no GPU here (nvidia-smi failed). Copy {} to a GPU host (CUDA driver, NCCL 2.18+, OpenMPI) and run:\n    BENCH=1 bash gpu-dist/run.sh            # checks and bench tables (nccl_bench) at 1, 2 and all visible GPUs (GPUS=N to choose), both modes\n    BENCH=1 bash gpu-dist/run-engine.sh     # the engine with GPU tensors\n    bash gpu-dist/run-pipeline.sh           # pipeline NCCL channels, threads and mpirun\n    BENCH=1 bash gpu-dist/run-python.sh     # the Python package with CUDA tensors, and against torch.distributed
    # logs, JSON bench rows and summary.txt in ${{OUT:-./gpu-out}}; without BENCH=1 only the checks",
            dist.display()
        );
        return Ok(());
    }
    for script in [
        "run.sh",
        "run-engine.sh",
        "run-pipeline.sh",
        "run-python.sh",
    ] {
        let status = Command::new("bash")
            .arg(script)
            .current_dir(&dist)
            .status()
            .with_context(|| format!("running gpu-dist/{script}"))?;
        if !status.success() {
            bail!("gpu-dist/{script} failed ({status})");
        }
    }
    Ok(())
}

/// Copies every file of `from` (the GPU scripts) into `dist`, executable;
/// returns their bytes.
fn copy_scripts(from: &Path, dist: &Path) -> Result<u64> {
    let mut total = 0;
    let entries = std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("reading {}", from.display()))?
            .path();
        if !path.is_file() {
            continue;
        }
        let Some(name) = path.file_name() else {
            continue;
        };
        let to = dist.join(name);
        total += std::fs::copy(&path, &to)
            .with_context(|| format!("copying {} to {}", path.display(), to.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))
                .with_context(|| format!("chmod {}", to.display()))?;
        }
    }
    Ok(total)
}
