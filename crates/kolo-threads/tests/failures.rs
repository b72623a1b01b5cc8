//! Failing ranks on the threads backend: a peer blocked in a collective
//! gets `PeerFailed` naming the failed rank instead of hanging, and
//! `run`'s error names the rank and its message. Checked for the native
//! collectives and for the generic ones over send / recv.

use kolo_protocol::ReduceOp;
use kolo_threads::ThreadComm;
use kolo_transport::{Collectives, Generic, Scale, Topology, TransportError};
use std::sync::Mutex;

/// An allreduce on the native or the generic collectives.
fn allreduce(comm: &mut ThreadComm, generic: bool) -> Result<(), TransportError> {
    let mut buf = vec![1.0f32; 4096];
    if generic {
        Generic(&mut *comm).allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)
    } else {
        comm.allreduce(&mut buf, ReduceOp::Sum, Scale::NONE)
    }
}

/// Runs `allreduce` on every rank but `culprit`, which runs `culprit_does`;
/// returns the error of `run` and the errors the other ranks saw.
fn run_with_culprit(
    n: usize,
    culprit: usize,
    generic: bool,
    culprit_does: impl Fn(&mut ThreadComm) -> Result<(), String> + Sync,
) -> (kolo_threads::RunError, Vec<(usize, TransportError)>) {
    let seen = Mutex::new(Vec::new());
    let err = kolo_threads::run(n, |comm| {
        if comm.rank() == culprit {
            return culprit_does(comm);
        }
        allreduce(comm, generic).map_err(|err| {
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((comm.rank(), err.clone()));
            err.to_string()
        })
    })
    .expect_err("a rank failed, so run must fail");
    let mut seen = seen.into_inner().unwrap_or_else(|p| p.into_inner());
    seen.sort_by_key(|(rank, _)| *rank);
    (err, seen)
}

/// Every rank but `culprit` failed with `PeerFailed`, naming the culprit:
/// as the failed rank, or (when the peer it waited on had itself just
/// failed because of the culprit) as the cause in that rank's message.
fn assert_peers_saw(seen: &[(usize, TransportError)], n: usize, culprit: usize) {
    let ranks: Vec<usize> = seen.iter().map(|(rank, _)| *rank).collect();
    let others: Vec<usize> = (0..n).filter(|&r| r != culprit).collect();
    assert_eq!(ranks, others, "every other rank must fail: {seen:?}");
    for (rank, err) in seen {
        let TransportError::PeerFailed {
            rank: failed,
            message,
        } = err
        else {
            panic!("rank {rank} should get PeerFailed: {err}");
        };
        let names_culprit = *failed == culprit || message.contains(&format!("rank {culprit} "));
        assert!(
            names_culprit,
            "rank {rank} should name rank {culprit}: {err}"
        );
    }
}

#[test]
fn a_panicking_rank_is_named_and_fails_its_peers() {
    for generic in [false, true] {
        let (err, seen) = run_with_culprit(4, 2, generic, |_| panic!("rank two exploded"));
        let cause = err.root_cause().expect("a root cause");
        assert_eq!((cause.rank, cause.panicked), (2, true), "{err}");
        assert!(cause.message.contains("rank two exploded"), "{err}");
        assert!(
            err.to_string()
                .starts_with("rank 2 panicked: rank two exploded"),
            "{err}"
        );
        assert_peers_saw(&seen, 4, 2);
    }
}

#[test]
fn an_erroring_rank_is_named_with_its_message() {
    for generic in [false, true] {
        let (err, seen) = run_with_culprit(5, 1, generic, |_| Err("tensor grad/w1 is NaN".into()));
        let cause = err.root_cause().expect("a root cause");
        assert_eq!((cause.rank, cause.panicked), (1, false), "{err}");
        assert_eq!(cause.message, "tensor grad/w1 is NaN");
        assert!(
            err.to_string()
                .starts_with("rank 1 failed: tensor grad/w1 is NaN"),
            "{err}"
        );
        assert_peers_saw(&seen, 5, 1);
        for (_, peer_err) in &seen {
            assert!(
                peer_err.to_string().contains("tensor grad/w1 is NaN"),
                "{peer_err}"
            );
        }
    }
}

#[test]
fn a_rank_that_returns_early_fails_its_peers() {
    for generic in [false, true] {
        let (err, seen) = run_with_culprit(3, 0, generic, |_| Ok(()));
        assert_peers_saw(&seen, 3, 0);
        assert!(
            err.failures.iter().all(|f| f.rank != 0 && !f.panicked),
            "{err}"
        );
        assert!(
            err.failures.iter().all(|f| f.message.contains("rank 0")),
            "{err}"
        );
    }
}

#[test]
fn a_failure_in_the_middle_of_the_suite_stops_every_rank() {
    let err = kolo_threads::run(3, |comm| {
        kolo_conformance::check_allreduce::<i32, _>(comm, 7, ReduceOp::Sum, Scale::NONE)?;
        if comm.rank() == 1 {
            return Err(kolo_conformance::Failure::Check {
                case: "injected".into(),
                rank: 1,
                message: "stop here".into(),
            });
        }
        kolo_conformance::check_allreduce::<i32, _>(comm, 7, ReduceOp::Max, Scale::NONE)
    })
    .expect_err("rank 1 stopped");
    assert_eq!(err.root_cause().map(|c| c.rank), Some(1), "{err}");
    assert!(
        err.to_string()
            .starts_with("rank 1 failed: injected: rank 1: stop here"),
        "{err}"
    );
}
