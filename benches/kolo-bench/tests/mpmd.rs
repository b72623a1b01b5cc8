//! `kolo-bench --backend mpi` under a real `mpirun` whose ranks are given
//! different arguments (MPMD: `mpirun -np 1 kolo-bench A : -np 1
//! kolo-bench B`): every such run ends, within the test's timeout, in an
//! error naming the setting, both values and both ranks, before any rank
//! measures anything. And the refusals of a single plan (an unwritable
//! `--json`, sizes beyond memory) end the whole job the same way.

use kolo_mpi::launcher::{mpirun_self, streams, Job};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// A hung job fails the test instead of hanging it.
const TIMEOUT: Duration = Duration::from_secs(120);

fn program() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_kolo-bench"))
}

/// Every rank's arguments: a short sweep (with `--max-bytes 1K`).
const SHORT: [&str; 6] = ["--backend", "mpi", "--warmup", "0", "--factor", "16"];

/// `mpirun -np 1 kolo-bench SHORT a : -np 1 kolo-bench SHORT b`.
fn mpmd(a: &[&str], b: &[&str]) -> Output {
    let program_arg = program().to_str().expect("a UTF-8 program path");
    let args: Vec<&str> = SHORT
        .iter()
        .chain(&["--max-bytes", "1K"])
        .chain(a)
        .chain(&[":", "-np", "1", program_arg])
        .chain(&SHORT)
        .chain(&["--max-bytes", "1K"])
        .chain(b)
        .copied()
        .collect();
    mpirun_self(program(), 1, &args, &[], TIMEOUT)
        .unwrap_or_else(|why| panic!("{a:?} : {b:?}: {why}"))
}

/// The job failed, naming `wanted`, and no rank printed a table.
fn assert_refused(out: &Output, what: &str, wanted: &str) {
    let all = streams(out);
    assert!(!out.status.success(), "{what}: the job succeeded\n{all}");
    assert!(all.contains(wanted), "{what}: no {wanted:?} in\n{all}");
    assert!(
        !all.contains("#       size"),
        "{what}: a rank measured\n{all}"
    );
    assert!(!all.contains("panicked"), "{what}\n{all}");
}

#[test]
fn disagreeing_arguments_end_in_an_error_naming_them() {
    let cases: [(&[&str], &[&str], &str); 9] = [
        (
            &["--op", "allreduce"],
            &["--op", "allgather"],
            "the ranks disagree on --op: rank 0 has allreduce, rank 1 has allgather",
        ),
        (
            &["--iters", "2"],
            &["--iters", "5"],
            "the ranks disagree on --iters: rank 0 has 2, rank 1 has 5",
        ),
        (
            &["--op", "allreduce,broadcast"],
            &["--op", "allreduce"],
            "--op: rank 0 has allreduce,broadcast, rank 1 has allreduce",
        ),
        (
            &["--dtype", "f32"],
            &["--dtype", "i32"],
            "--dtype: rank 0 has f32, rank 1 has i32",
        ),
        (
            &["--engine", "--iters", "2"],
            &["--engine", "--iters", "5"],
            "--iters: rank 0 has 2, rank 1 has 5",
        ),
        (
            &["--engine", "--tensors", "2"],
            &["--engine", "--tensors", "3"],
            "--tensors: rank 0 has 2, rank 1 has 3",
        ),
        (
            &[],
            &["--engine"],
            "mode: rank 0 has direct (no --engine, no --compare), rank 1 has --engine",
        ),
        (
            &["--compare"],
            &[],
            "mode: rank 0 has --compare, rank 1 has direct",
        ),
        (
            &["--redop", "max"],
            &["--redop", "min"],
            "--redop: rank 0 has max, rank 1 has min",
        ),
    ];
    // A rank whose arguments cannot run at all stops before MPI starts;
    // mpirun then ends the job rather than leave its peer waiting.
    let cases = cases.into_iter().chain([
        (
            &["--iters", "0"][..],
            &["--iters", "2"][..],
            "--iters must be at least 1",
        ),
        (
            &["--engine"][..],
            &["--engine", "--op", "sendrecv"][..],
            "sendrecv has no engine operation",
        ),
    ]);
    for (a, b, wanted) in cases {
        let out = mpmd(a, b);
        assert_refused(&out, &format!("{a:?} : {b:?}"), wanted);
    }
}

/// `np` ranks with the same arguments.
fn same(np: usize, args: &[&str]) -> Output {
    let all: Vec<&str> = SHORT.iter().chain(args).copied().collect();
    Job::new(format!("kolo-bench {args:?}"), np)
        .args(all)
        .timeout(TIMEOUT)
        .run(program())
        .unwrap_or_else(|why| panic!("{why}"))
}

#[test]
fn one_ranks_refusal_ends_every_rank() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("missing/rows.json");
    let path = path.to_str().expect("a UTF-8 temporary path");
    for mode in [&[][..], &["--engine"][..], &["--compare"][..]] {
        let args: Vec<&str> = ["--json", path, "--max-bytes", "1K"]
            .iter()
            .chain(mode)
            .copied()
            .collect();
        let out = same(2, &args);
        assert_refused(&out, &format!("{args:?}"), &format!("writing {path}"));
        // The other rank says whose problem stopped it.
        assert!(
            streams(&out).contains("rank 0 cannot run"),
            "{}",
            streams(&out)
        );
    }
    for mode in [&[][..], &["--engine"][..]] {
        let args: Vec<&str> = ["--min-bytes", "1024G", "--max-bytes", "1024G"]
            .iter()
            .chain(mode)
            .copied()
            .collect();
        let out = same(2, &args);
        assert_refused(
            &out,
            &format!("{args:?}"),
            "not enough memory on the host of rank",
        );
        assert!(
            streams(&out).contains("x 2 rank(s) on that host"),
            "{}",
            streams(&out)
        );
    }
}
