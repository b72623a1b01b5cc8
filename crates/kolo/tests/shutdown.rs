//! Shutdown, early returns and failing ranks: pending handles fail naming
//! the rank responsible, never hang.

mod common;

use common::{config, expect_err};
use kolo::{Error, ReduceOp};

#[test]
fn an_explicit_shutdown_fails_pending_handles() {
    kolo::threads::run(2, config(), |kolo| {
        let mut x = [1i32; 4];
        if kolo.rank() == 0 {
            let pending = kolo.allreduce_async("pending", &mut x, ReduceOp::Sum)?;
            kolo.barrier()?;
            assert_eq!(pending.wait(), Err(Error::ShutDown { by_ranks: vec![1] }));
        } else {
            kolo.barrier()?;
            kolo.shutdown()?;
            kolo.shutdown()?; // idempotent
        }
        assert!(kolo.is_shut_down());
        let err = expect_err(
            kolo.allreduce("after", &mut x, ReduceOp::Sum),
            "after shutdown",
        );
        assert_eq!(err, Error::ShutDown { by_ranks: vec![1] });
        assert_eq!(
            err.to_string(),
            "kolo was shut down at the request of rank 1"
        );
        Ok(())
    })
    .unwrap();
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
fn a_panicking_rank_fails_its_peers_handles_naming_it() {
    let err = kolo::threads::run(3, config(), |kolo| {
        let mut x = [1i32; 4];
        if kolo.rank() == 1 {
            kolo.barrier()?;
            panic!("boom");
        }
        let orphan = kolo.allreduce_async("orphan", &mut x, ReduceOp::Sum)?;
        kolo.barrier()?;
        match orphan.wait() {
            Err(Error::RankFailed { rank: 1, message }) => {
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
            assert!(message.contains("rank 1 panicked: boom"), "{message}")
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
