//! Thread mode in one call: one thread per GPU, each with the control
//! plane the caller made for its rank (any kolo [`Controller`], e.g.
//! kolo-threads' in-process communicators) and an [`NcclComm`] on device
//! `rank`.

use crate::error::NcclError;
use crate::options::{Mode, NcclOptions};
use crate::safe::comm::NcclComm;
use crate::safe::work::Health;
use kolo_transport::Controller;
use parking_lot::Mutex;
use std::any::Any;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

/// How one rank of [`run`] ended badly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFailure {
    /// The rank that failed.
    pub rank: usize,
    /// Its error's `Display`, or its panic message.
    pub message: String,
    /// True if the rank panicked rather than returning an error.
    pub panicked: bool,
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.panicked { "panicked" } else { "failed" };
        write!(f, "rank {} {how}: {}", self.rank, self.message)
    }
}

/// The ranks of a [`run`] that failed, in the order they failed: the
/// first is the root cause (the others usually failed because their
/// communicators were broken after it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunError {
    /// Every failed rank, first failure first.
    pub failures: Vec<RankFailure>,
}

impl RunError {
    /// The first failure.
    pub fn root_cause(&self) -> Option<&RankFailure> {
        self.failures.first()
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((first, rest)) = self.failures.split_first() else {
            return f.write_str("no rank failed");
        };
        write!(f, "{first}")?;
        for (i, failure) in rest.iter().enumerate() {
            f.write_str(if i == 0 { "; then " } else { "; " })?;
            write!(f, "{failure}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RunError {}

/// Runs `f` on one thread per controller in `ctrls` (controller r must be
/// rank r of a communicator of `ctrls.len()` ranks), rank r on device r
/// (unless `options.device` pins one), and returns the results in rank
/// order.
///
/// Communicators are created with [`NcclComm::init`] over the
/// controllers, in thread mode unless `options.mode` says otherwise. When
/// a rank fails (its `f` returns an error or panics), the other ranks'
/// communicators are marked broken so their pending GPU work fails
/// promptly instead of waiting out the operation timeout, and its
/// controller is dropped when its thread ends (kolo-threads' controllers
/// then fail every peer blocked on it). The error lists every failed
/// rank, the first failure first.
pub fn run<C, R, F>(ctrls: Vec<C>, options: NcclOptions, f: F) -> Result<Vec<R>, RunError>
where
    C: Controller + Send,
    R: Send,
    F: Fn(&mut NcclComm, &mut C) -> Result<R, NcclError> + Sync,
{
    check_ranks(&ctrls)?;
    let healths: Mutex<Vec<Arc<Health>>> = Mutex::new(Vec::new());
    // Ranks in the order they failed.
    let failed: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let break_all = |rank: usize, message: &str| {
        failed.lock().push(rank);
        let cause = NcclError::Bootstrap {
            rank,
            message: format!("a peer thread failed: {message}"),
        };
        for health in healths.lock().iter() {
            health.fail(&cause);
        }
    };
    let rank_main = |rank: usize, mut ctrl: C| -> Result<R, RankFailure> {
        let mut opts = options.clone();
        opts.device = opts.device.or(Some(rank));
        opts.mode = opts.mode.or(Some(Mode::ThreadPerGpu));
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
            let mut comm = NcclComm::init(&mut ctrl, opts)?;
            healths.lock().push(comm.health.clone());
            f(&mut comm, &mut ctrl)
        }));
        let failure = match outcome {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => RankFailure {
                rank,
                message: e.to_string(),
                panicked: false,
            },
            Err(payload) => RankFailure {
                rank,
                message: panic_message(payload.as_ref()),
                panicked: true,
            },
        };
        break_all(rank, &failure.message);
        Err(failure)
    };
    let outcomes: Vec<Result<R, RankFailure>> = std::thread::scope(|scope| {
        let rank_main = &rank_main;
        let handles: Vec<_> = ctrls
            .into_iter()
            .enumerate()
            .map(|(rank, ctrl)| {
                std::thread::Builder::new()
                    .name(format!("kolo-nccl-rank-{rank}"))
                    .spawn_scoped(scope, move || rank_main(rank, ctrl))
                    .map_err(|e| {
                        let message = format!("could not start its thread: {e}");
                        break_all(rank, &message);
                        RankFailure {
                            rank,
                            message,
                            panicked: false,
                        }
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, handle)| {
                handle?.join().unwrap_or_else(|payload| {
                    Err(RankFailure {
                        rank,
                        message: panic_message(payload.as_ref()),
                        panicked: true,
                    })
                })
            })
            .collect()
    });
    let order = failed.into_inner();
    let mut values = Vec::with_capacity(outcomes.len());
    let mut failures = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(value) => values.push(value),
            Err(failure) => failures.push(failure),
        }
    }
    if failures.is_empty() {
        return Ok(values);
    }
    failures.sort_by_key(|f| {
        order
            .iter()
            .position(|&r| r == f.rank)
            .unwrap_or(usize::MAX)
    });
    Err(RunError { failures })
}

/// Controller r must be rank r of a communicator of `ctrls.len()` ranks.
fn check_ranks<C: Controller>(ctrls: &[C]) -> Result<(), RunError> {
    let failures: Vec<RankFailure> = ctrls
        .iter()
        .enumerate()
        .filter(|(i, c)| c.rank() != *i || c.size() != ctrls.len())
        .map(|(i, c)| RankFailure {
            rank: i,
            message: format!(
                "controller {i} of {} is rank {} of a {}-rank communicator; thread mode needs \
                 the controllers of ranks 0..{} in rank order",
                ctrls.len(),
                c.rank(),
                c.size(),
                ctrls.len()
            ),
            panicked: false,
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(RunError { failures })
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_transport::{BitOp, Topology};

    /// A controller that only knows its place (every collective fails).
    struct Place {
        rank: usize,
        size: usize,
    }

    impl Topology for Place {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn local_rank(&self) -> usize {
            self.rank
        }
        fn local_size(&self) -> usize {
            self.size
        }
    }

    impl Controller for Place {
        fn gather_bytes(
            &mut self,
            _: &[u8],
            _: usize,
        ) -> kolo_transport::Result<Option<Vec<Vec<u8>>>> {
            Err(unreachable_peer())
        }
        fn broadcast_bytes(&mut self, _: &[u8], _: usize) -> kolo_transport::Result<Vec<u8>> {
            Err(unreachable_peer())
        }
        fn allgather_bytes(&mut self, _: &[u8]) -> kolo_transport::Result<Vec<Vec<u8>>> {
            Err(unreachable_peer())
        }
        fn control_barrier(&mut self) -> kolo_transport::Result<()> {
            Err(unreachable_peer())
        }
        fn bitwise_allreduce(&mut self, _: &mut [u64], _: BitOp) -> kolo_transport::Result<()> {
            Err(unreachable_peer())
        }
    }

    fn unreachable_peer() -> kolo_transport::TransportError {
        kolo_transport::TransportError::PeerFailed {
            rank: 0,
            message: "no peer in this test".into(),
        }
    }

    #[test]
    fn controllers_out_of_rank_order_are_refused_before_any_thread_starts() {
        let ctrls = vec![Place { rank: 1, size: 2 }, Place { rank: 0, size: 2 }];
        let e = run(ctrls, NcclOptions::default(), |_, _| Ok(())).unwrap_err();
        assert_eq!(e.failures.len(), 2);
        assert!(
            e.to_string()
                .contains("controller 0 of 2 is rank 1 of a 2-rank communicator"),
            "{e}"
        );
        let e = run(
            vec![Place { rank: 0, size: 3 }],
            NcclOptions::default(),
            |_, _| Ok(()),
        )
        .unwrap_err();
        assert_eq!(e.root_cause().map(|f| f.rank), Some(0));
    }

    #[test]
    fn a_control_plane_that_fails_fails_every_rank_without_a_hang() {
        let ctrls = vec![Place { rank: 0, size: 2 }, Place { rank: 1, size: 2 }];
        let e = run(ctrls, NcclOptions::default(), |_, _| Ok(())).unwrap_err();
        let mut ranks: Vec<usize> = e.failures.iter().map(|f| f.rank).collect();
        ranks.sort_unstable();
        assert_eq!(ranks, [0, 1]);
        for f in &e.failures {
            assert!(!f.panicked);
            assert!(f.message.contains("no peer in this test"), "{f}");
        }
    }

    #[test]
    fn no_controllers_run_nothing() {
        let out: Vec<()> = run(Vec::<Place>::new(), NcclOptions::default(), |_, _| Ok(())).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn failures_are_listed_first_failure_first() {
        let e = RunError {
            failures: vec![
                RankFailure {
                    rank: 1,
                    message: "no GPU".into(),
                    panicked: false,
                },
                RankFailure {
                    rank: 0,
                    message: "boom".into(),
                    panicked: true,
                },
            ],
        };
        assert_eq!(
            e.to_string(),
            "rank 1 failed: no GPU; then rank 0 panicked: boom"
        );
    }
}
