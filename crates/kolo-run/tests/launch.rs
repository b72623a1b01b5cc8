//! kolo-run as a user starts it: the variables each rank sees, a job of
//! ranks that meet through the rendezvous, and a rank killed with SIGKILL
//! ending the job with an error naming it and no rank left running.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn kolo_run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kolo-run"))
        .args(args)
        .output()
        .expect("kolo-run runs")
}

#[test]
fn every_rank_gets_torchruns_variables() {
    let out = kolo_run(&[
        "-n",
        "3",
        "--master-port",
        "0",
        "sh",
        "-c",
        "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR ${#KOLO_RENDEZVOUS_TOKEN} $OMP_NUM_THREADS",
    ]);
    assert!(out.status.success(), "{out:?}");
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "0 3 0 3 0 127.0.0.1 32 1",
            "1 3 1 3 0 127.0.0.1 32 1",
            "2 3 2 3 0 127.0.0.1 32 1"
        ]
    );
}

#[test]
fn ranks_meet_through_the_rendezvous() {
    let out = kolo_run(&[
        "-n",
        "4",
        "--master-port",
        "0",
        env!("CARGO_BIN_EXE_kolo-rendezvous-check"),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for rank in 0..4 {
        assert!(
            text.contains(&format!("rank {rank} of 4 (local {rank} of 4) met 4 ranks")),
            "{text}"
        );
    }
}

#[test]
fn a_rank_killed_ends_the_job_naming_it() {
    let start = Instant::now();
    let out = kolo_run(&[
        "-n",
        "3",
        "--master-port",
        "0",
        "--grace",
        "5",
        "sh",
        "-c",
        "if [ $RANK = 1 ]; then sleep 0.2; kill -9 $$; fi; sleep 60",
    ]);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "the others were stopped"
    );
    assert_eq!(out.status.code(), Some(128 + 9), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rank 1") && err.contains("killed by signal 9 (SIGKILL)"),
        "{err}"
    );
}

#[test]
fn a_rank_that_fails_passes_its_status_on() {
    let out = kolo_run(&[
        "-n",
        "2",
        "--master-port",
        "0",
        "sh",
        "-c",
        "if [ $RANK = 0 ]; then exit 3; fi; sleep 60",
    ]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("rank 0"));
}

#[test]
fn bad_arguments_are_refused_naming_them() {
    let out = kolo_run(&["--nnodes", "2", "--node-rank", "2", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node-rank 2"));
    let out = kolo_run(&["-n", "1", "--master-port", "0", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not start"));
}

#[test]
fn stopping_kolo_run_stops_every_rank() {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kolo-run"))
        .args(["-n", "2", "--master-port", "0", "sleep", "60"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15));
    assert!(start.elapsed() < Duration::from_secs(30));
}
