//! Smoke test of the built `kolo-bench` binary: every op over the threads
//! backend on two ranks, results checked, rows written as JSON.

use std::process::Command;

fn kolo_bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kolo-bench"))
        .args(args)
        .output()
        .expect("the kolo-bench binary runs")
}

#[test]
fn every_op_on_two_threads_is_correct() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let json = dir.path().join("rows.json");
    let json_arg = json.to_str().expect("a UTF-8 temporary path");
    let out = kolo_bench(&[
        "--backend",
        "threads",
        "--ranks",
        "2",
        "--op",
        "all",
        "--min-bytes",
        "8",
        "--max-bytes",
        "64K",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--json",
        json_arg,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON file"))
            .expect("a JSON array");
    // 14 sizes (8 B .. 64 KiB) for each of the six ops.
    assert_eq!(rows.len(), 6 * 14, "{stdout}");
    for op in [
        "allreduce",
        "allgather",
        "broadcast",
        "reducescatter",
        "alltoall",
        "sendrecv",
    ] {
        assert_eq!(rows.iter().filter(|r| r["op"] == op).count(), 14, "{op}");
        assert!(
            stdout.contains(&format!("# {op}: threads backend, 2 ranks")),
            "{stdout}"
        );
    }
    for row in &rows {
        assert_eq!(row["wrong"], 0, "{row}");
        assert_eq!(row["ranks"], 2);
        assert!(row["time_us"].as_f64().is_some_and(|t| t > 0.0), "{row}");
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
}

#[test]
fn every_dtype_and_redop_checks_out() {
    for dtype in [
        "u8", "i8", "u16", "i16", "i32", "i64", "f16", "bf16", "f32", "f64", "bool",
    ] {
        for redop in ["sum", "average", "min", "max", "product"] {
            // The copying ops ignore the redop: run them once per dtype.
            let ops = if redop == "sum" {
                "all"
            } else {
                "allreduce,reducescatter"
            };
            let out = kolo_bench(&[
                "--ranks",
                "3",
                "--op",
                ops,
                "--dtype",
                dtype,
                "--redop",
                redop,
                "--min-bytes",
                "8",
                "--max-bytes",
                "4K",
                "--factor",
                "8",
                "--iters",
                "1",
                "--warmup",
                "1",
            ]);
            assert!(
                out.status.success(),
                "{dtype} {redop}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn engine_mode_fuses_k_tensors_correctly() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let json = dir.path().join("engine.json");
    let json_arg = json.to_str().expect("a UTF-8 temporary path");
    let modes = [["", ""], ["--grouped", ""], ["--tensor-group", ""]];
    for mode in modes {
        let mut args = vec![
            "--engine",
            "--tensors",
            "3",
            "--ranks",
            "2",
            "--op",
            "all",
            "--dtype",
            "bf16",
            "--min-bytes",
            "8",
            "--max-bytes",
            "16K",
            "--factor",
            "4",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--fusion-threshold",
            "4K",
            "--cycle-time",
            "0.5",
            "--json",
            json_arg,
        ];
        args.extend(mode.into_iter().filter(|flag| !flag.is_empty()));
        let out = kolo_bench(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "stdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("# sendrecv: skipped"), "{stdout}");
        if mode[0] == "--tensor-group" {
            assert!(stdout.contains("one TensorGroup, blocking"), "{stdout}");
        }
        let rows: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON file"))
                .expect("a JSON array");
        // Sizes too small for 3 tensors per rank block are skipped; the rest remain.
        for op in [
            "allreduce",
            "allgather",
            "broadcast",
            "reducescatter",
            "alltoall",
        ] {
            assert!(
                rows.iter().filter(|r| r["op"] == op).count() >= 4,
                "{op}: {stdout}"
            );
        }
        for row in &rows {
            assert_eq!(
                (&row["mode"], &row["tensors"], &row["wrong"]),
                (&"engine".into(), &3.into(), &0.into()),
                "{row}"
            );
        }
    }
}

#[test]
fn bad_flags_fail_with_a_message() {
    let out = kolo_bench(&["--max-bytes", "12Q"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("12Q"));
    let out = kolo_bench(&["--min-bytes", "1M", "--max-bytes", "1K"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--min-bytes"));
    let out = kolo_bench(&["--engine", "--op", "sendrecv"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sendrecv"));
}

#[cfg(not(feature = "mpi"))]
#[test]
fn the_mpi_backend_without_the_feature_says_how_to_build_it() {
    let out = kolo_bench(&["--backend", "mpi", "--op", "allreduce"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--features mpi") && stderr.contains("mpirun"),
        "{stderr}"
    );
}

#[test]
fn compare_on_threads_prints_direct_and_engine_side_by_side() {
    let out = kolo_bench(&[
        "--compare",
        "--ranks",
        "2",
        "--op",
        "allreduce",
        "--min-bytes",
        "8",
        "--max-bytes",
        "1K",
        "--factor",
        "32",
        "--iters",
        "2",
        "--warmup",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("# allreduce: threads backend, 2 ranks\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("kolo engine, 1 tensor(s) per step"),
        "{stdout}"
    );
    // 8 B and 256 B, each with a direct and an engine time; no MPI column.
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("# same-run comparison"))
        .skip(2)
        .collect();
    assert_eq!(table.len(), 2, "{stdout}");
    for line in table {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[0], "allreduce", "{line}");
        assert_eq!((cells[2], cells[4]), ("-", "-"), "{line}");
        assert!(
            cells[6].starts_with('+') || cells[6].starts_with('-'),
            "{line}"
        );
    }
}

#[test]
fn the_memory_floor_prints_its_row_and_refuses_a_bad_size() {
    let floor = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_memory-floor"))
            .args(args)
            .output()
            .expect("the memory-floor binary runs")
    };
    let out = floor(&[
        "--ranks", "3", "--bytes", "64K", "--iters", "3", "--warmup", "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}");
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| !l.starts_with('#') && l.trim_start().starts_with(char::is_numeric))
        .expect("a result row")
        .split_whitespace()
        .collect();
    assert_eq!(row[0], "65536", "{stdout}");
    assert!(row[1].parse::<f64>().is_ok_and(|us| us > 0.0), "{stdout}");

    let out = floor(&["--bytes", "6"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("6 bytes"), "{stderr}");
}
