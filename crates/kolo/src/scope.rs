//! Zero-copy host collectives: inside a [`Scope`] (like
//! `std::thread::scope`), the engine reduces the caller's buffers in place.
//!
//! The plain `*_async` calls copy their input into the engine and the
//! result back, because safe Rust cannot rely on a handle being dropped
//! (it may be leaked) and the engine must never write into memory that is
//! gone. A scope ties the borrow to itself instead: [`Kolo::scope`] returns
//! only once the engine is done with every tensor submitted in it, whatever
//! became of the handles, so the engine can work on the caller's memory
//! directly — the fusion buffer is packed from it and unpacked into it.
//! The blocking [`Kolo::allreduce`] and [`Kolo::grouped_allreduce`] run in
//! a scope of their own.

use crate::engine::lease::Leases;
use crate::engine::submission::Submission;
use crate::error::Error;
use crate::group::TensorGroup;
use crate::handle::Handle;
use crate::kolo::Kolo;
use crate::ops::ReduceOptions;
use crate::tensor::{shape_problem, TensorMut};
use kolo_protocol::RequestKind;
use kolo_transport::Element;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// A scope for zero-copy collectives on host tensors (see
/// [`Kolo::scope`]): tensors borrowed for `'scope` may be submitted, and
/// the scope does not end before the engine is done with all of them.
pub struct Scope<'scope, 'env: 'scope> {
    core: ScopeCore<'scope, 'env>,
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.core.debug("Scope", f)
    }
}

/// What every scope ([`crate::Scope`], the GPU engine's device scope)
/// holds: the engine, the leases on the tensors lent in it, and its two
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
    /// Runs `f` with a scope in which host collectives are submitted
    /// without a copy: the engine reduces the caller's buffers in place.
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

impl<'scope> Scope<'scope, '_> {
    /// Submits an allreduce of `buf`, reduced in place by the engine (no
    /// copy); the result is in `buf` once the scope has returned.
    pub fn allreduce_async<T: Element>(
        &self,
        name: &str,
        buf: impl Into<TensorMut<'scope, T>>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'scope, ()>, Error> {
        self.grouped_allreduce_async([(name, buf.into())], options)
    }

    /// Submits several allreduces together (they reach the same cycle and
    /// fuse as far as the fusion threshold allows), reduced in place; one
    /// handle for the group. On an error nothing is submitted.
    pub fn grouped_allreduce_async<'n, T: Element>(
        &self,
        tensors: impl IntoIterator<Item = (&'n str, TensorMut<'scope, T>)>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'scope, ()>, Error> {
        let options = options.into();
        let kolo = self.core.kolo;
        let tensors = tensors.into_iter();
        let template = kolo.reduce_params(RequestKind::Allreduce, &[], T::DTYPE, options);
        let lease = Some(self.core.leases.lease());
        let mut group = Submission::new(template, tensors.size_hint().0, false, lease);
        lend_all(&mut group, tensors)?;
        let completion = kolo.submit(group.quietly(self.core.blocking))?;
        Ok(Handle::new(completion, |_| Ok(())))
    }

    /// Submits the allreduces of the tensors of `group`, reduced in place
    /// (as [`Scope::grouped_allreduce_async`]): `tensors` gives one buffer
    /// per tensor, in the group's order. The engine recognises the group
    /// by the [`TensorGroup`] itself and reads no name, which makes this
    /// the cheapest way to submit the same tensors step after step. A
    /// count or shape that does not fit is an [`Error::InvalidArgument`]
    /// naming the tensor; on an error nothing is submitted.
    pub fn allreduce_group_async<T: Element, V: Into<TensorMut<'scope, T>>>(
        &self,
        group: &TensorGroup,
        tensors: impl IntoIterator<Item = V>,
        options: impl Into<ReduceOptions>,
    ) -> Result<Handle<'scope, ()>, Error> {
        let tensors = tensors.into_iter().map(Into::into);
        self.submit_group::<T>(group, options.into(), |submission| {
            lend_group(submission, group, tensors)
        })
    }

    /// [`Scope::allreduce_group_async`] of plain 1-D buffers (the blocking
    /// [`Kolo::allreduce_group`]): a slice's shape is its length, so
    /// nothing but the count is checked, and no view is built per tensor.
    pub(crate) fn allreduce_group_slices<T: Element>(
        &self,
        group: &TensorGroup,
        tensors: &'scope mut [&mut [T]],
        options: ReduceOptions,
    ) -> Result<Handle<'scope, ()>, Error> {
        self.submit_group::<T>(group, options, |submission| {
            group.check_count(tensors.len())?;
            for buf in tensors.iter_mut() {
                submission.push_lent_data(&[buf.len()], buf);
            }
            Ok(())
        })
    }

    /// Submits the allreduces of `group`'s tensors of `T`, whose buffers
    /// `lend` checks and lends to the submission (nothing is submitted if
    /// it fails).
    fn submit_group<T: Element>(
        &self,
        group: &TensorGroup,
        options: ReduceOptions,
        lend: impl FnOnce(&mut Submission<'_>) -> Result<(), Error>,
    ) -> Result<Handle<'scope, ()>, Error> {
        let kolo = self.core.kolo;
        let template = kolo.reduce_params(RequestKind::Allreduce, &[], T::DTYPE, options);
        let lease = Some(self.core.leases.lease());
        let mut submission = Submission::known(template, group.list(), lease);
        lend(&mut submission)?;
        let completion = kolo.submit(submission.quietly(self.core.blocking))?;
        Ok(Handle::new(completion, |_| Ok(())))
    }
}

/// Adds the buffers `tensors` of `group`'s tensors to `submission`, lent,
/// once [`TensorGroup::each_buffer`] checked them. Out of line, as
/// [`lend_all`].
#[inline(never)]
fn lend_group<'scope, T: Element>(
    submission: &mut Submission<'_>,
    group: &TensorGroup,
    tensors: impl Iterator<Item = TensorMut<'scope, T>>,
) -> Result<(), Error> {
    group.each_buffer(tensors, |data, shape| {
        submission.push_lent_data(shape, data)
    })
}

/// Adds every tensor of `tensors` to `group`, lent. Kept out of line: a
/// loop of its own, whatever the caller's iterator (inlined into
/// kolo-bench's step closure, it spilled its vectors' lengths to the
/// stack on every tensor).
#[inline(never)]
fn lend_all<'n, 'scope, T: Element>(
    group: &mut Submission<'n>,
    tensors: impl Iterator<Item = (&'n str, TensorMut<'scope, T>)>,
) -> Result<(), Error> {
    for (name, tensor) in tensors {
        let (data, shape) = tensor.into_parts();
        if let Some(reason) = shape_problem(&shape, data.len()) {
            return Err(Error::InvalidArgument {
                tensor: name.to_owned(),
                reason,
            });
        }
        group.push_lent(name, &shape, data);
    }
    Ok(())
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
            // One by one, grouped, or as a tensor group (twice: a repeat).
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
                            let views = names
                                .iter()
                                .map(String::as_str)
                                .zip(bufs.iter_mut().map(|b| TensorMut::from(&mut b[..])));
                            s.grouped_allreduce_async(views, ReduceOp::Sum)?.wait()
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
