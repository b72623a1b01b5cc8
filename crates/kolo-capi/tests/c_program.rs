//! The C example (`examples/train.c`) built by the system's C compiler
//! against the shared library and `include/kolo.h`, then run as a job of
//! one process (threads) and of 2 and 3 processes under kolo-run (UCX over
//! shared memory): every rank must report every check held.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How long one job may take (3 processes share CI's 2 cores).
const JOB_BOUND: Duration = Duration::from_secs(240);

/// The directory cargo put this crate's shared library in (the test's
/// own directory's parent: `target/<profile>`).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let dir = deps
        .parent()
        .expect("the profile's directory")
        .to_path_buf();
    assert!(
        dir.join("libkolo_capi.so").exists() || deps.join("libkolo_capi.so").exists(),
        "libkolo_capi.so is not in {}",
        dir.display()
    );
    if dir.join("libkolo_capi.so").exists() {
        dir
    } else {
        deps.to_path_buf()
    }
}

/// Compiles the example into `out`.
fn build_example(out: &Path) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
    let exe = out.join("train");
    let output = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(crate_dir.join("examples/train.c"))
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lkolo_capi")
        .output()
        .expect("cc runs");
    assert!(
        output.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    exe
}

#[test]
fn the_c_example_runs_alone_and_at_2_and_3_processes() {
    let dir = tempfile_dir();
    let exe = build_example(&dir);

    // Alone: no launcher's variables, one rank on threads.
    let mut alone = Command::new(&exe);
    for var in [
        "WORLD_SIZE",
        "RANK",
        "KOLO_WORLD_SIZE",
        "KOLO_RANK",
        "KOLO_BACKEND",
    ] {
        alone.env_remove(var);
    }
    let output = alone.output().expect("the example runs");
    assert!(
        output.status.success(),
        "alone: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "rank 0 of 1: ok"
    );

    for np in [2, 3] {
        let env = [("UCX_TLS", "sm,self"), ("KOLO_LOG_LEVEL", "error")];
        let ranks = kolo_run::run_captured(np, &exe, &[], &env, JOB_BOUND)
            .unwrap_or_else(|e| panic!("{np} processes: {e}"));
        for r in &ranks {
            assert!(
                r.succeeded(),
                "{np} processes, rank {}: {:?}\n{}{}",
                r.rank,
                r.status,
                r.stdout,
                r.stderr
            );
            // UCX may log to stdout too (a transport without peer error
            // handling): the example's line is one of the lines.
            let expected = format!("rank {} of {np}: ok", r.rank);
            assert!(
                r.stdout.lines().any(|l| l.trim() == expected),
                "{np} processes, rank {}: no '{expected}' in\n{}",
                r.rank,
                r.stdout
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory for the build.
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kolo-capi-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}
