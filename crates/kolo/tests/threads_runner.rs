//! What `kolo::threads::run` does with ranks that fail, return early or
//! cannot start (the engine's cases themselves are the engine suite's, in
//! `engine_suite.rs`).

use kolo::{Config, Error, ReduceOp};
use kolo_engine_suite::{expect_err, failure};
use std::time::Duration;

fn config() -> Config {
    Config::default().cycle_time(Duration::from_micros(500))
}

/// The suite's training loop with rank 1 panicking mid-training: the
/// peers' handles fail naming it, later calls too, and `run` returns the
/// panic as the cause.
#[test]
fn a_panicking_rank_fails_its_peers_handles_naming_it() {
    let err = kolo::threads::run(3, config(), |kolo| {
        let err = expect_err(
            failure::train(kolo, |step| panic!("boom at step {step}")),
            "training",
        );
        match &err {
            Error::RankFailed { rank: 1, message } => {
                assert!(message.contains("boom"), "{message}")
            }
            other => panic!("expected rank 1's failure, got {other:?}"),
        }
        // The engine stopped: later operations fail the same way.
        let later = expect_err(kolo.barrier(), "after the failure");
        assert!(
            matches!(later, Error::RankFailed { rank: 1, .. }),
            "{later:?}"
        );
        Ok(())
    })
    .unwrap_err();
    match err {
        Error::RankFailed { rank: 1, message } => {
            let cause = format!("rank 1 panicked: boom at step {}", failure::FAIL_AT);
            assert!(message.contains(&cause), "{message}")
        }
        other => panic!("expected rank 1's panic, got {other:?}"),
    }
}

#[test]
fn a_rank_that_returns_an_error_fails_its_peers() {
    let err = kolo::threads::run(2, config(), |kolo| {
        if kolo.rank() == 0 {
            return Err(Error::InvalidArgument {
                tensor: "data".into(),
                reason: "the loader gave up".into(),
            });
        }
        let mut x = [1i32; 4];
        let err = expect_err(kolo.allreduce("orphan", &mut x, ReduceOp::Sum), "peer error");
        assert!(
            matches!(&err, Error::RankFailed { rank: 0, message } if message.contains("the loader gave up")),
            "{err:?}"
        );
        Ok(())
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("the loader gave up"),
        "the cause is returned: {err}"
    );
}

#[test]
fn a_rank_that_returns_early_shuts_everyone_down() {
    kolo::threads::run(3, config(), |kolo| {
        if kolo.rank() == 2 {
            return Ok(()); // its Kolo drops: a shutdown request
        }
        let mut x = [1i32; 4];
        let err = expect_err(
            kolo.allreduce("never", &mut x, ReduceOp::Sum),
            "early return",
        );
        assert_eq!(err, Error::ShutDown { by_ranks: vec![2] });
        Ok(())
    })
    .unwrap();
}

#[test]
fn kolo_outside_threads_run_shuts_down_on_drop() {
    let comms = kolo_threads::communicators(2).unwrap();
    let engines: Vec<kolo::Kolo> = comms
        .into_iter()
        .map(|c| kolo::Kolo::start(c, config()).unwrap())
        .collect();
    std::thread::scope(|s| {
        for kolo in &engines {
            s.spawn(move || {
                let mut x = [2i64; 3];
                kolo.allreduce("x", &mut x, ReduceOp::Sum).unwrap();
                assert_eq!(x, [4; 3]);
            });
        }
    });
    assert_eq!(engines[1].stats().tensors, 1);
    drop(engines);
}

/// A timeline that cannot be created fails `run` before any rank starts:
/// the cause, `Error::Timeline`, every time — never a peer's echo of rank
/// 0 leaving, however busy the ranks are.
#[test]
fn a_timeline_that_cannot_be_created_is_the_error_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-dir").join("t.json");
    for attempt in 0..60 {
        let err = kolo::threads::run(3, config().timeline(&path), |kolo| {
            let mut x = vec![1.0f32; 4096];
            for step in 0..20 {
                kolo.allreduce(&format!("busy/{step}"), &mut x, ReduceOp::Sum)?;
            }
            Ok(())
        })
        .unwrap_err();
        assert!(
            matches!(&err, Error::Timeline { path: p, .. } if p == &path),
            "attempt {attempt}: {err:?}"
        );
    }
}

/// Engines started one after the other on one thread: rank 0 cannot open
/// its timeline and says so; its peer starts, and its first operation
/// fails naming rank 0 and why (every rank's first cycle agrees that all
/// started), instead of waiting for it.
#[test]
fn a_rank_that_cannot_start_fails_its_peers_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-dir").join("t.json");
    let mut comms = kolo_threads::communicators(2).unwrap().into_iter();
    let (zero, one) = (comms.next().unwrap(), comms.next().unwrap());
    let err = kolo::Kolo::start(zero, config().timeline(&path)).unwrap_err();
    assert!(matches!(&err, Error::Timeline { .. }), "{err:?}");
    let peer = kolo::Kolo::start(one, config().timeline(&path)).unwrap();
    let mut x = [1i32; 4];
    let err = expect_err(
        peer.allreduce("x", &mut x, ReduceOp::Sum),
        "a peer that never started",
    );
    assert!(
        matches!(&err, Error::RankFailed { rank: 0, message } if message.contains("could not start") && message.contains("missing-dir")),
        "{err:?}"
    );
}

/// A backend whose construction panics on the engine's thread: the start
/// fails with the panic's message.
#[test]
fn a_panic_while_starting_is_reported_with_its_message() {
    let err = kolo::Kolo::start_on_thread(
        || -> Result<kolo_threads::ThreadComm, Error> { panic!("no such device: 7") },
        config(),
        |_: &mut kolo_threads::ThreadComm, _: &str| {},
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::Start { message } if message.contains("no such device: 7")),
        "{err:?}"
    );
}

/// Settings out of bounds fail the start, naming the setting, before any
/// rank runs — also for an engine started directly.
#[test]
fn settings_out_of_bounds_fail_the_start_naming_them() {
    let huge = config().cache_capacity(usize::MAX);
    let err = kolo::threads::run(2, huge.clone(), |_| Ok(())).unwrap_err();
    assert!(
        matches!(&err, Error::Config { variable, .. } if variable == "Config::cache_capacity"),
        "{err:?}"
    );
    let comm = kolo_threads::communicators(1).unwrap().pop().unwrap();
    let err = kolo::Kolo::start(comm, huge).unwrap_err();
    assert!(matches!(&err, Error::Config { .. }), "{err:?}");
}

/// Ranks started with different cache capacities fail together, naming
/// the variable, instead of disagreeing later on a cache slot.
#[test]
fn ranks_with_different_cache_capacities_fail_naming_the_setting() {
    let comms = kolo_threads::communicators(2).unwrap();
    let errors: Vec<Error> = std::thread::scope(|s| {
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                s.spawn(move || {
                    let kolo = kolo::Kolo::start(comm, config().cache_capacity(16 + rank)).unwrap();
                    let mut x = [1i32; 2];
                    expect_err(
                        kolo.allreduce("x", &mut x, ReduceOp::Sum),
                        "capacities differ",
                    )
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for err in errors {
        assert!(
            matches!(&err, Error::Config { variable, .. } if variable == "KOLO_CACHE_CAPACITY"),
            "{err:?}"
        );
    }
}

/// A caller's own error type for [`kolo::threads::run_all`].
#[derive(Debug)]
enum StepError {
    Kolo(Error),
    Diverged { rank: usize },
}

impl From<Error> for StepError {
    fn from(e: Error) -> Self {
        StepError::Kolo(e)
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::Kolo(e) => write!(f, "{e}"),
            StepError::Diverged { rank } => write!(f, "rank {rank} diverged"),
        }
    }
}

#[test]
fn run_all_returns_every_ranks_own_outcome() {
    let outcomes = kolo::threads::run_all(3, config(), |kolo| {
        if kolo.rank() == 2 {
            return Err(StepError::Diverged { rank: 2 });
        }
        // Rank 2 never submits: the others' allreduce fails naming it.
        let mut x = [1i32; 4];
        kolo.allreduce("x", &mut x, ReduceOp::Sum)?;
        Ok(x)
    })
    .expect("the run starts");
    assert_eq!(outcomes.len(), 3);
    for (rank, outcome) in outcomes.iter().enumerate().take(2) {
        match outcome {
            Err(StepError::Kolo(Error::RankFailed {
                rank: failed,
                message,
            })) => {
                assert_eq!(*failed, 2, "rank {rank}: {message}");
                assert!(
                    message.contains("rank 2 diverged"),
                    "rank {rank}: {message}"
                );
            }
            other => panic!("rank {rank}: expected a failure naming rank 2, got {other:?}"),
        }
    }
    assert!(matches!(outcomes[2], Err(StepError::Diverged { rank: 2 })));
    // Kolo's own failures reach the caller's type; the run itself is fine.
    let outcomes = kolo::threads::run_all(2, config(), |kolo| -> Result<usize, StepError> {
        if kolo.rank() == 1 {
            panic!("boom");
        }
        Ok(kolo.rank())
    })
    .expect("the run starts");
    assert!(matches!(&outcomes[0], Ok(0)), "{:?}", outcomes[0]);
    match &outcomes[1] {
        Err(StepError::Kolo(Error::RankFailed { rank: 1, message })) => {
            assert!(message.contains("boom"), "{message}")
        }
        other => panic!("expected rank 1's panic, got {other:?}"),
    }
    // A run that cannot begin is the outer error.
    let bad = Config::default().cycle_time(Duration::from_secs(3600));
    assert!(kolo::threads::run_all(2, bad, |_| Ok::<_, StepError>(())).is_err());
}

/// When a thread rank panics in [`panicking_rank_case`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PanicAt {
    /// Before its first collective.
    Before,
    /// In step [`PANIC_STEP`], with the step's first allreduce submitted
    /// (and reduced with the peers') and its second not.
    During,
    /// Once step [`PANIC_STEP`] completed, before the next.
    After,
}

/// The step a rank panics in (or after).
const PANIC_STEP: usize = 2;

/// How long one case may take before it counts as hung.
const CASE_BOUND: Duration = Duration::from_secs(60);

/// `rank` of `np` panics at `at`; the others train until a call fails.
/// Every other rank's failing call must be the first one that cannot
/// complete without the culprit (or the one before, which may race with
/// its panic) and name it, and `run` must return the panic as the cause.
fn panicking_rank_case(np: usize, culprit: usize, at: PanicAt) -> Result<(), String> {
    let case = format!("rank {culprit} of {np} panicking {at:?} a collective");
    let boom = match at {
        PanicAt::Before => format!("rank {culprit} panics before its first collective"),
        PanicAt::During => format!("rank {culprit} panics in step {PANIC_STEP}, half submitted"),
        PanicAt::After => format!("rank {culprit} panics after step {PANIC_STEP}"),
    };
    let seen = std::sync::Mutex::new(Vec::new());
    let err = kolo::threads::run(np, config(), |kolo| {
        let rank = kolo.rank();
        let culprit_at = |phase: PanicAt| rank == culprit && at == phase;
        if culprit_at(PanicAt::Before) {
            panic!("{boom}");
        }
        for step in 0..=PANIC_STEP + 1 {
            if culprit_at(PanicAt::After) && step == PANIC_STEP + 1 {
                panic!("{boom}");
            }
            let (mut first, mut second) = (vec![1.0f32; 4096], vec![2i64; 64]);
            let outcome = kolo.scope(|s| {
                let a = s.allreduce_async(&format!("step{step}/a"), &mut first, ReduceOp::Sum)?;
                if culprit_at(PanicAt::During) && step == PANIC_STEP {
                    panic!("{boom}");
                }
                let b = s.allreduce_async(&format!("step{step}/b"), &mut second, ReduceOp::Sum)?;
                a.wait()?;
                b.wait()
            });
            if let Err(e) = outcome {
                let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                seen.push((rank, step, e.clone()));
                return Err(e);
            }
        }
        Ok(())
    })
    .err()
    .ok_or_else(|| format!("{case}: run succeeded"))?;
    let cause = format!("rank {culprit} panicked: {boom}");
    match &err {
        Error::RankFailed { rank, message } if *rank == culprit && message.contains(&cause) => {}
        other => return Err(format!("{case}: run returned {other:?}, not {cause:?}")),
    }
    let mut seen = seen.into_inner().unwrap_or_else(|p| p.into_inner());
    seen.sort_by_key(|(rank, ..)| *rank);
    let ranks: Vec<usize> = seen.iter().map(|(rank, ..)| *rank).collect();
    let others: Vec<usize> = (0..np).filter(|&r| r != culprit).collect();
    if ranks != others {
        return Err(format!(
            "{case}: ranks {ranks:?} failed, not {others:?}: {seen:?}"
        ));
    }
    // The first step the culprit never completes, and the one before.
    let stuck = match at {
        PanicAt::Before => 0,
        PanicAt::During => PANIC_STEP,
        PanicAt::After => PANIC_STEP + 1,
    };
    for (rank, step, e) in &seen {
        let named = match e {
            Error::RankFailed { rank: failed, .. } => *failed == culprit,
            other => other.to_string().contains(&format!("rank {culprit} ")),
        };
        if !named || *step > stuck || *step + 1 < stuck {
            return Err(format!("{case}: rank {rank} failed at step {step}: {e:?}"));
        }
    }
    Ok(())
}

/// A thread rank that panics before, during or after a collective, at 2,
/// 3 and 4 ranks, as rank 0 and as the last rank: every other rank's call
/// fails naming it, `run` returns the panic as the cause, and no case
/// hangs (each is bounded by [`CASE_BOUND`]).
#[test]
fn a_rank_panicking_before_during_or_after_a_collective_fails_every_peer() {
    let mut cases = Vec::new();
    for np in [2, 3, 4] {
        for at in [PanicAt::Before, PanicAt::During, PanicAt::After] {
            cases.extend([(np, 0, at), (np, np - 1, at)]);
        }
    }
    for (np, culprit, at) in cases {
        let (done, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(panicking_rank_case(np, culprit, at));
        });
        match outcome.recv_timeout(CASE_BOUND) {
            Ok(result) => result.unwrap_or_else(|why| panic!("{why}")),
            Err(_) => panic!("rank {culprit} of {np} panicking {at:?}: hung for {CASE_BOUND:?}"),
        }
    }
}

/// A join waits, by design, while the other ranks still work: past the
/// operation timeout too. Rank 0 joins at once; rank 1 works for three
/// timeouts (its allreduces complete without rank 0) and then joins.
#[test]
fn a_join_that_waits_longer_than_the_timeout_is_not_a_timeout() {
    let config = Config::default().timeout(Duration::from_millis(500));
    let last = kolo::threads::run(2, config, |kolo| {
        if kolo.rank() == 1 {
            for step in 0..6 {
                std::thread::sleep(Duration::from_millis(250));
                let mut x = [2.0f32; 4];
                kolo.allreduce(&format!("work/{step}"), &mut x, ReduceOp::Sum)?;
                assert_eq!(x, [2.0; 4], "the joined rank contributes nothing");
            }
        }
        kolo.join()
    })
    .expect("both ranks join");
    assert_eq!(last, [1, 1]);
}
