//! `kolo-bench --backend mpi` under a real `mpirun` (needs the `mpi`
//! feature: `cargo test -p kolo-bench --features mpi`): one process per
//! rank, rank 0 alone prints the tables, results checked, rows as JSON.

use kolo_mpi::launcher::Job;
use serde_json::Value;
use std::path::Path;

/// Runs `kolo-bench args...` on `np` processes; returns stdout and the JSON
/// rows it wrote.
fn mpirun_bench(np: usize, args: &[&str]) -> (String, Vec<Value>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let json = dir.path().join("rows.json");
    let mut all: Vec<&str> = args.to_vec();
    let json_arg = json.to_str().expect("a UTF-8 temporary path");
    all.extend(["--json", json_arg]);
    let out = Job::new(format!("kolo-bench {args:?}"), np)
        .args(all)
        .env("OMPI_MCA_mpi_yield_when_idle", "1")
        .run_checked(Path::new(env!("CARGO_BIN_EXE_kolo-bench")))
        .unwrap_or_else(|why| panic!("{why}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows = serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON file"))
        .expect("a JSON array");
    (stdout, rows)
}

#[test]
fn every_op_on_mpi_processes_is_correct() {
    for np in [2, 3] {
        let (stdout, rows) = mpirun_bench(
            np,
            &[
                "--backend",
                "mpi",
                "--op",
                "all",
                "--dtype",
                "i32",
                "--min-bytes",
                "8",
                "--max-bytes",
                "64K",
                "--factor",
                "8",
                "--iters",
                "2",
                "--warmup",
                "1",
            ],
        );
        // 8 B .. 64 KiB by 8: 6 sizes (fewer for the gathered ops at tiny
        // sizes), six ops, all checked, printed once (by rank 0).
        for op in [
            "allreduce",
            "allgather",
            "broadcast",
            "reducescatter",
            "alltoall",
            "sendrecv",
        ] {
            let title = format!("# {op}: mpi backend, {np} ranks");
            assert_eq!(stdout.matches(&title).count(), 1, "{stdout}");
            assert!(rows.iter().filter(|r| r["op"] == op).count() >= 5, "{op}");
        }
        for row in &rows {
            assert_eq!(
                (&row["wrong"], &row["ranks"], &row["backend"], &row["mode"]),
                (&0.into(), &np.into(), &"mpi".into(), &"direct".into()),
                "{row}"
            );
        }
        assert_eq!(stdout.matches("# Out of bounds values : 0 OK").count(), 1);
    }
}

#[test]
fn compare_prints_kolo_mpi_and_engine_rows_together() {
    let (stdout, rows) = mpirun_bench(
        2,
        &[
            "--backend",
            "mpi",
            "--compare",
            "--op",
            "allreduce,broadcast",
            "--min-bytes",
            "8",
            "--max-bytes",
            "1M",
            "--factor",
            "32",
            "--iters",
            "3",
            "--warmup",
            "1",
        ],
    );
    let count = |op: &str, mode: &str| {
        rows.iter()
            .filter(|r| r["op"] == op && r["mode"] == mode)
            .count()
    };
    // 8 B, 256 B, 8 KiB, 256 KiB: direct, engine, and (allreduce) plain MPI.
    assert_eq!(count("allreduce", "direct"), 4, "{stdout}");
    assert_eq!(count("allreduce", "baseline"), 4, "{stdout}");
    assert_eq!(count("allreduce", "engine"), 4, "{stdout}");
    assert_eq!(count("broadcast", "baseline"), 0, "{stdout}");
    assert_eq!(count("broadcast", "engine"), 4, "{stdout}");
    assert!(rows.iter().all(|r| r["wrong"] == 0), "{stdout}");
    assert!(stdout.contains("plain MPI_Allreduce baseline"), "{stdout}");
    assert!(stdout.contains("# same-run comparison"), "{stdout}");
    assert!(stdout.contains("engine-direct"), "{stdout}");
}

#[test]
fn engine_mode_over_init_mpi_fuses_k_tensors() {
    let (stdout, rows) = mpirun_bench(
        3,
        &[
            "--backend",
            "mpi",
            "--engine",
            "--tensors",
            "3",
            "--op",
            "allreduce,allgather,sendrecv",
            "--dtype",
            "bf16",
            "--min-bytes",
            "64",
            "--max-bytes",
            "16K",
            "--factor",
            "4",
            "--iters",
            "2",
            "--warmup",
            "1",
        ],
    );
    assert!(stdout.contains("# sendrecv: skipped"), "{stdout}");
    assert!(rows.len() >= 6, "{stdout}");
    for row in &rows {
        assert_eq!(
            (&row["mode"], &row["tensors"], &row["wrong"], &row["ranks"]),
            (&"engine".into(), &3.into(), &0.into(), &3.into()),
            "{row}"
        );
    }
}
