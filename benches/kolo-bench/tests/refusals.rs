//! What `kolo-bench` refuses before it measures anything, and what it says
//! on stderr: sizes beyond memory or 64 bits are errors (never an abort
//! or a panic), an unwritable `--json` path fails before any timing,
//! skipped sizes say why, and kolo's log lines reach the user without
//! escape codes when stderr is not a terminal.

use std::process::{Command, Output};

fn kolo_bench(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kolo-bench"));
    cmd.args(args).env_remove("NO_COLOR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the kolo-bench binary runs")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A failure reported by kolo-bench itself: exit status 1, not a signal
/// (an abort) nor 101 (a panic), and no table row printed.
fn refused(args: &[&str]) -> String {
    let out = kolo_bench(args, &[]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !stdout.contains("#       size"),
        "{args:?} measured: {stdout}"
    );
    stderr
}

#[test]
fn sizes_beyond_memory_are_errors_before_allocating() {
    let size = ["--min-bytes", "1024G", "--max-bytes", "1024G"];
    let cases: [&[&str]; 5] = [
        &[],
        &["--op", "all"],
        &["--op", "alltoall", "--ranks", "3"],
        &["--engine", "--op", "allreduce,allgather"],
        &["--compare"],
    ];
    for case in cases {
        let args: Vec<&str> = size.iter().chain(case).copied().collect();
        let ranks = if case.contains(&"3") { 3 } else { 2 };
        let stderr = refused(&args);
        assert!(
            stderr.contains("not enough memory on the host of rank 0")
                && stderr.contains(&format!("per rank x {ranks} rank(s)"))
                && stderr.contains("available ("),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn sizes_past_64_bits_are_errors_not_panics() {
    let stderr = refused(&[
        "--min-bytes",
        "9223372036854775808",
        "--max-bytes",
        "9223372036854775808",
    ]);
    assert!(
        stderr.contains("9223372036854775808") && stderr.contains("2^64"),
        "{stderr}"
    );
    let max = u64::MAX.to_string();
    let stderr = refused(&["--min-bytes", "8", "--max-bytes", &max, "--op", "alltoall"]);
    assert!(stderr.contains("2^64"), "{stderr}");
    let stderr = refused(&["--iters", &max, "--warmup", "1"]);
    assert!(stderr.contains("--iters"), "{stderr}");
    let stderr = refused(&["--iters", "100000000000000", "--max-bytes", "8"]);
    assert!(stderr.contains("not enough memory"), "{stderr}");
}

#[test]
fn an_unwritable_json_path_fails_before_any_timing() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("no/such/dir/rows.json");
    let path = path.to_str().expect("a UTF-8 temporary path");
    for mode in [&[][..], &["--engine"][..], &["--compare"][..]] {
        let mut args = vec!["--json", path, "--max-bytes", "64K", "--iters", "2"];
        args.extend(mode);
        let stderr = refused(&args);
        assert!(stderr.contains(&format!("writing {path}")), "{stderr}");
    }
}

#[test]
fn the_json_file_is_created_before_the_sweep_and_filled_after() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("rows.json");
    std::fs::write(&path, "stale").expect("a file to overwrite");
    let out = kolo_bench(
        &[
            "--json",
            path.to_str().expect("a UTF-8 temporary path"),
            "--max-bytes",
            "64",
            "--iters",
            "1",
            "--warmup",
            "0",
        ],
        &[],
    );
    assert!(out.status.success(), "{:?}", text(&out));
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the JSON file"))
            .expect("a JSON array");
    assert_eq!(rows.len(), 4, "8 B .. 64 B");
}

#[test]
fn skipped_sizes_say_why_and_all_skipped_is_an_error() {
    let out = kolo_bench(
        &[
            "--engine",
            "--tensors",
            "4",
            "--ranks",
            "2",
            "--op",
            "allreduce",
            "--max-bytes",
            "64",
            "--iters",
            "1",
            "--warmup",
            "0",
        ],
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("#   8 B skipped: 2 element(s) cannot make 4 tensors"),
        "{stdout}"
    );
    assert!(!stdout.contains("16 B skipped"), "{stdout}");
    let stderr = refused(&["--engine", "--tensors", "1000", "--max-bytes", "1K"]);
    assert!(
        stderr.contains("--tensors 1000") && stderr.contains("1024 B skipped: 256 element(s)"),
        "{stderr}"
    );
}

#[test]
fn kolo_logs_reach_stderr_without_escape_codes() {
    let out = kolo_bench(
        &[
            "--engine",
            "--ranks",
            "2",
            "--max-bytes",
            "64",
            "--iters",
            "1",
            "--warmup",
            "0",
        ],
        &[("KOLO_LOG_LEVEL", "debug")],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("DEBUG") && stderr.contains("kolo"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "escape codes in a pipe: {stderr:?}"
    );
    assert!(
        !stdout.contains('\x1b'),
        "escape codes in a pipe: {stdout:?}"
    );
}

#[test]
fn a_bad_kolo_variable_is_an_error_naming_it() {
    let out = kolo_bench(&["--max-bytes", "64"], &[("KOLO_LOG_LEVEL", "loud")]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("KOLO_LOG_LEVEL") && stderr.contains("loud"),
        "{stderr}"
    );
}
