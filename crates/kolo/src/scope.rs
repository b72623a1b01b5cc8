//! Asynchronous collectives: inside a [`Scope`] (like `std::thread::scope`)
//! a rank submits operations that run while it computes, and the engine
//! works on the caller's buffers in place.
//!
//! Safe Rust cannot rely on a handle being dropped (it may be leaked), and
//! the engine must never write into memory that is gone. A scope ties the
//! borrow to itself instead: [`Kolo::scope`] returns only once the engine
//! is done with every tensor submitted in it, whatever became of the
//! handles, so the engine can work on the caller's memory directly — the
//! fusion buffer is packed from it and unpacked into it. The blocking
//! calls on [`Kolo`] run in a scope of their own. The calls themselves
//! live with their collectives (`crate::ops`).

use crate::engine::completion::Completion;
use crate::engine::lease::{Lease, Leases};
use crate::engine::submission::{Input, Submission};
use crate::error::Error;
use crate::kolo::Kolo;
use kolo_protocol::Params;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// A scope for zero-copy collectives on host or device tensors (see
/// [`Kolo::scope`]): tensors borrowed for `'scope` may be submitted, and
/// the scope does not end before the engine is done with all of them (on
/// a GPU, before the GPU is).
pub struct Scope<'scope, 'env: 'scope> {
    core: ScopeCore<'scope, 'env>,
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.core.debug("Scope", f)
    }
}

/// What a [`crate::Scope`] holds: the engine, the leases on the tensors lent in it, and its two
/// lifetimes (invariant, like `std::thread::Scope`'s): `'scope`, for which
/// tensors are lent, inside `'env`, for which the engine is borrowed.
pub(crate) struct ScopeCore<'scope, 'env: 'scope> {
    pub(crate) kolo: &'env Kolo,
    pub(crate) leases: Arc<Leases>,
    /// The scope of a blocking call, which waits for its submission at
    /// once: its submissions do not wake the background thread (see
    /// `Submission::quietly`).
    pub(crate) blocking: bool,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'env> ScopeCore<'_, 'env> {
    /// A scope on `kolo` with no tensor lent yet.
    pub(crate) fn new(kolo: &'env Kolo) -> Self {
        ScopeCore {
            kolo,
            leases: Arc::new(Leases::default()),
            blocking: false,
            _scope: PhantomData,
            _env: PhantomData,
        }
    }

    /// Runs `body` (the caller's closure on the scope), then waits until
    /// the engine returned every lease of `leases` — also when `body`
    /// panicked, whose panic is resumed after that.
    pub(crate) fn run<R>(leases: Arc<Leases>, body: impl FnOnce() -> R) -> R {
        let outcome = catch_unwind(AssertUnwindSafe(body));
        leases.wait_all();
        outcome.unwrap_or_else(|panic| resume_unwind(panic))
    }

    /// The `Debug` output of a scope type called `name`.
    pub(crate) fn debug(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(name)
            .field("rank", &self.kolo.rank())
            .finish()
    }
}

impl Kolo {
    /// Runs `f` with a scope in which collectives are submitted without
    /// blocking and without a copy of what they write: the engine reduces
    /// the caller's buffers in place, host or device memory alike.
    /// Returns `f`'s result once the engine is done with every tensor
    /// submitted in the scope (a panic in `f` is resumed after that); the
    /// results are in the buffers when the scope has returned.
    ///
    /// ```
    /// kolo::threads::run(2, kolo::Config::default(), |kolo| {
    ///     let mut weights = vec![1.0f32; 1024];
    ///     let mut bias = vec![kolo.rank() as f32; 16];
    ///     kolo.scope(|s| {
    ///         let w = s.allreduce_async("w", &mut weights, kolo::ReduceOp::Sum)?;
    ///         let b = s.allreduce_async("b", &mut bias, kolo::ReduceOp::Max)?;
    ///         w.wait()?;
    ///         b.wait()
    ///     })?;
    ///     assert_eq!(weights[0], 2.0);
    ///     assert_eq!(bias[0], 1.0);
    ///     Ok(())
    /// })?;
    /// # Ok::<(), kolo::Error>(())
    /// ```
    pub fn scope<'env, R>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
    ) -> R {
        self.scope_of(false, f)
    }

    /// The scope of a blocking call, which waits for what it submits at
    /// once: its submissions leave the background thread asleep, and the
    /// wait runs the engine's cycles on the caller's thread where it can
    /// (see `crate::engine::progress`).
    pub(crate) fn blocking_scope<'env, R>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
    ) -> R {
        self.scope_of(true, f)
    }

    /// A scope whose end nobody waits for, lending tensors under `leases`:
    /// the raw layer's (`crate::raw`), whose callers vouch for their
    /// memory until each operation completed instead of a borrow.
    pub(crate) fn detached_scope(&self) -> Scope<'_, '_> {
        Scope {
            core: ScopeCore::new(self),
        }
    }

    /// [`Kolo::scope`], for a blocking call or not.
    fn scope_of<'env, R>(
        &'env self,
        blocking: bool,
        f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
    ) -> R {
        let mut core = ScopeCore::new(self);
        core.blocking = blocking;
        let scope = Scope { core };
        ScopeCore::run(Arc::clone(&scope.core.leases), || f(&scope))
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// The engine the scope submits to.
    pub(crate) fn kolo(&self) -> &'env Kolo {
        self.core.kolo
    }

    /// A lease of the scope, for a submission: the scope does not end
    /// before it is back.
    pub(crate) fn lease(&self) -> Lease {
        self.core.leases.lease()
    }

    /// `submission`, quiet when the scope is a blocking call's (see
    /// `Submission::quietly`).
    pub(crate) fn quietly<'n>(&self, submission: Submission<'n>) -> Submission<'n> {
        submission.quietly(self.core.blocking)
    }

    /// Submits one tensor of the scope whose handle gets an output (the
    /// engine's copy of the result).
    pub(crate) fn submit_one(
        &self,
        name: &str,
        params: Params,
        input: Input,
    ) -> Result<Arc<Completion>, Error> {
        let shape = params.shape.clone();
        let mut submission = Submission::new(params, 1, true, Some(self.lease()));
        submission.push(name, &shape, input);
        self.core.kolo.submit(self.quietly(submission))
    }
}

#[cfg(test)]
mod tests {
    use crate::{threads, Config, Error, ReduceOp, TensorGroup, TensorMut};
    use proptest::prelude::*;
    use std::time::Duration;

    /// Rank `rank`'s tensor `t` of `len` elements.
    fn input(rank: usize, t: usize, len: usize) -> Vec<i64> {
        (0..len)
            .map(|i| (rank * 1000 + t * 10 + i) as i64)
            .collect()
    }

    /// Every rank's tensors `t` summed.
    fn summed(ranks: usize, t: usize, len: usize) -> Vec<i64> {
        (0..len)
            .map(|i| (0..ranks).map(|r| input(r, t, len)[i]).sum())
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(6))]
        #[test]
        fn scoped_allreduces_land_in_the_callers_buffers(
            ranks in 2usize..5,
            lens in prop::collection::vec(0usize..300, 1..12),
            threshold in prop::sample::select(vec![0usize, 64, 1 << 20]),
            // One by one, a group made per step, or one tensor group (twice: a repeat).
            mode in 0u8..3,
        ) {
            let config = Config::default().fusion_threshold(threshold);
            let lens_ref = &lens;
            let results = threads::run(ranks, config, |kolo| {
                let names: Vec<String> = (0..lens_ref.len()).map(|t| format!("s{t}")).collect();
                let group = TensorGroup::new(&names)?;
                let mut steps = Vec::new();
                for _ in 0..2 {
                    let mut bufs: Vec<Vec<i64>> = lens_ref
                        .iter()
                        .enumerate()
                        .map(|(t, &len)| input(kolo.rank(), t, len))
                        .collect();
                    kolo.scope(|s| match mode {
                        0 => {
                            let handles = names
                                .iter()
                                .zip(bufs.iter_mut())
                                .map(|(name, buf)| s.allreduce_async(name, buf, ReduceOp::Sum))
                                .collect::<Result<Vec<_>, _>>()?;
                            handles.into_iter().try_for_each(|h| h.wait())
                        }
                        1 => {
                            // A group made for this step, with shaped views.
                            let fresh = TensorGroup::new(&names)?;
                            let views = bufs.iter_mut().map(|b| TensorMut::from(&mut b[..]));
                            s.allreduce_group_async(&fresh, views, ReduceOp::Sum)?.wait()
                        }
                        _ => {
                            let views = bufs.iter_mut().map(|b| &mut b[..]);
                            s.allreduce_group_async(&group, views, ReduceOp::Sum)?.wait()
                        }
                    })?;
                    steps.push(bufs);
                }
                Ok(steps)
            })
            .unwrap();
            for steps in results {
                for bufs in steps {
                    for (t, buf) in bufs.iter().enumerate() {
                        prop_assert_eq!(buf, &summed(ranks, t, lens[t]));
                    }
                }
            }
        }
    }

    #[test]
    fn a_scope_waits_for_tensors_whose_handles_were_forgotten() {
        let results = threads::run(3, Config::default(), |kolo| {
            let mut a = vec![kolo.rank() as f32 + 1.0; 4096];
            let mut b = [kolo.rank() as u8; 3];
            kolo.scope(|s| {
                std::mem::forget(s.allreduce_async("a", &mut a, ReduceOp::Sum)?);
                drop(s.allreduce_async("b", &mut b[..], ReduceOp::Max)?);
                Ok::<(), Error>(())
            })?;
            Ok((a, b))
        })
        .unwrap();
        for (a, b) in results {
            assert!(a.iter().all(|&x| x == 6.0));
            assert_eq!(b, [2; 3]);
        }
    }

    #[test]
    fn a_mismatch_fails_every_rank_and_the_next_scope_works() {
        let results = threads::run(2, Config::default(), |kolo| {
            let mut bad = vec![1i32; 4 + kolo.rank()];
            let err = kolo
                .scope(|s| s.allreduce_async("bad", &mut bad, ReduceOp::Sum)?.wait())
                .unwrap_err();
            assert_eq!(
                bad,
                vec![1; 4 + kolo.rank()],
                "a refused tensor is untouched"
            );
            let mut good = [kolo.rank() as i32; 2];
            kolo.allreduce("good", &mut good[..], ReduceOp::Sum)?;
            Ok((err, good))
        })
        .unwrap();
        for (err, good) in results {
            assert!(matches!(err, Error::Mismatch { .. }), "{err}");
            assert!(err.to_string().contains("bad"), "{err}");
            assert_eq!(good, [1, 1]);
        }
    }

    #[test]
    fn a_name_in_flight_is_refused_and_the_scope_still_ends() {
        let results = threads::run(2, Config::default(), |kolo| {
            let (mut x, mut y) = ([1u16; 8], [2u16; 8]);
            let refused = kolo.scope(|s| {
                let first = s.allreduce_async("x", &mut x[..], ReduceOp::Sum)?;
                let second = s.allreduce_async("x", &mut y[..], ReduceOp::Sum);
                first.wait()?;
                Ok::<_, Error>(second.err())
            })?;
            Ok((refused, x, y))
        })
        .unwrap();
        for (refused, x, y) in results {
            assert_eq!(refused, Some(Error::DuplicateName { tensor: "x".into() }));
            assert_eq!((x, y), ([2; 8], [2; 8]));
        }
    }

    #[test]
    fn a_panic_in_the_scope_is_resumed_after_the_engine_is_done() {
        let results = threads::run(2, Config::default(), |kolo| {
            let mut x = vec![1.0f64; 100];
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                kolo.scope(|s| {
                    let _pending = s.allreduce_async("x", &mut x, ReduceOp::Sum);
                    panic!("the training step failed");
                })
            }));
            assert!(caught.is_err());
            Ok(x)
        })
        .unwrap();
        for x in results {
            assert_eq!(x, vec![2.0; 100]);
        }
    }

    #[test]
    fn shutting_down_fails_a_scopes_pending_tensors_and_ends_it() {
        let config = Config::default().stall_check(Some(Duration::from_secs(60)));
        let results = threads::run(2, config, |kolo| {
            if kolo.rank() == 1 {
                // Never submits "lonely": rank 0's tensor stays pending
                // until this rank's engine shuts every rank down.
                return Ok(None);
            }
            let mut lonely = [1i64; 4];
            let outcome = kolo.scope(|s| {
                s.allreduce_async("lonely", &mut lonely[..], ReduceOp::Sum)?
                    .wait()
            });
            Ok(Some((outcome, lonely)))
        })
        .unwrap();
        let (outcome, lonely) = results[0].clone().expect("rank 0's outcome");
        assert!(
            matches!(outcome, Err(Error::ShutDown { .. })),
            "{outcome:?}"
        );
        assert_eq!(lonely, [1; 4]);
    }
}
