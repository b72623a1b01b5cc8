//! The pipeline example as four processes started by kolo-run's library
//! (torchrun's variables): its channels two-rank UCX communicators made
//! through kolo-rendezvous, each rank checking its stage bit for bit
//! against the sequential run.

use std::path::PathBuf;
use std::time::Duration;

/// An example of this package, which `cargo test` builds beside the
/// tests (`target/<profile>/examples/`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    profile.join("examples").join(name)
}

#[test]
fn the_pipeline_example_runs_as_four_processes() {
    let exe = example("pipeline");
    assert!(
        exe.exists(),
        "{} not built: run the package's tests whole (`cargo test -p kolo-pipeline`), which builds its examples",
        exe.display()
    );
    let env = [("UCX_TLS", "sm,self"), ("KOLO_RENDEZVOUS_TIMEOUT", "60")];
    let ranks = kolo_run::run_captured(4, &exe, &[], &env, Duration::from_secs(300)).unwrap();
    assert_eq!(ranks.len(), 4);
    for rank in &ranks {
        assert!(
            rank.succeeded(),
            "rank {}: {:?}\n{}\n{}",
            rank.rank,
            rank.status,
            rank.stdout,
            rank.stderr
        );
        let want = format!("rank {}: ", rank.rank);
        assert!(
            rank.stdout
                .lines()
                .any(|l| l.starts_with(&want)
                    && l.ends_with("equal the sequential run's bit for bit")),
            "rank {}: {}",
            rank.rank,
            rank.stdout
        );
    }
}
