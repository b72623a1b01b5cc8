//! Barrier and join: blocking on [`Kolo`], asynchronous in a [`Scope`].

use super::output;
use crate::engine::submission::Input;
use crate::error::Error;
use crate::handle::Handle;
use crate::kolo::Kolo;
use crate::scope::Scope;
use kolo_protocol::{DataType, Params, RequestKind};

impl Kolo {
    /// Returns once every rank has entered the barrier (negotiated like any
    /// operation, then a barrier on the backend).
    pub fn barrier(&self) -> Result<(), Error> {
        self.blocking_scope(|s| s.barrier_async()?.wait())
    }

    /// Declares that this rank has no more batches (Horovod's join): until
    /// every rank has joined, this rank takes part in the other ranks'
    /// allreduces, allgathers and broadcasts, contributing the reduce op's
    /// identity (zero for a sum) or zero rows, so that ranks with fewer
    /// batches need not invent data. Returns, once every rank has joined,
    /// the last rank to join (the same on every rank, as Horovod's `join`;
    /// of ranks that joined in the same negotiation cycle, the highest).
    pub fn join(&self) -> Result<usize, Error> {
        self.blocking_scope(|s| s.join_async()?.wait())
    }

    fn control_params(&self, kind: RequestKind) -> Params {
        self.params(kind, DataType::U8, &[])
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Submits a barrier (see [`Kolo::barrier`]). A rank may have up to
    /// 16 barriers in flight at once (their names repeat every 16 calls);
    /// one more fails with [`Error::DuplicateName`].
    pub fn barrier_async(&self) -> Result<Handle<'scope, ()>, Error> {
        let kolo = self.kolo();
        let name = kolo.next_barrier_name();
        let completion = self.submit_one(
            &name,
            kolo.control_params(RequestKind::Barrier),
            Input::None,
        )?;
        Ok(Handle::new(completion, |_| Ok(())))
    }

    /// Submits this rank's join (see [`Kolo::join`]); the handle returns
    /// the last rank to join. Up to 16 joins may be in flight at once, as
    /// for [`Scope::barrier_async`].
    pub fn join_async(&self) -> Result<Handle<'scope, usize>, Error> {
        let kolo = self.kolo();
        let name = kolo.next_join_name();
        let completion =
            self.submit_one(&name, kolo.control_params(RequestKind::Join), Input::None)?;
        Ok(Handle::new(completion, move |payloads| {
            output::<usize>(&name, payloads.into_iter().next())
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::kolo::{control_name, CONTROL_NAMES};
    use crate::{threads, Config, Error};
    use proptest::prelude::*;
    use std::collections::HashSet;

    proptest! {
        /// However many barriers a rank ran, its barrier names number at
        /// most `CONTROL_NAMES`, and the names of the last `CONTROL_NAMES`
        /// calls differ (so that many may be in flight at once).
        #[test]
        fn control_names_are_few_and_distinct_within_a_window(start in 0u64..1 << 40, calls in 1u64..2000) {
            let names: Vec<String> = (start..start + calls).map(|n| control_name("barrier", n)).collect();
            let all: HashSet<&String> = names.iter().collect();
            prop_assert!(all.len() as u64 <= CONTROL_NAMES);
            for window in names.windows(CONTROL_NAMES as usize) {
                prop_assert_eq!(window.iter().collect::<HashSet<_>>().len(), window.len());
            }
            prop_assert_ne!(control_name("barrier", start), control_name("join", start));
        }
    }

    /// Barriers past the first window reuse their names: their responses
    /// come from the response cache (a name of its own per barrier would
    /// never hit it, and would keep a tensor id per barrier), and a full
    /// window of barriers may be in flight at once.
    #[test]
    fn repeated_barriers_reuse_their_names_and_hit_the_cache() {
        let hits = threads::run(2, Config::default(), |kolo| {
            for _ in 0..3 * CONTROL_NAMES {
                kolo.barrier()?;
            }
            kolo.scope(|s| {
                let handles = (0..CONTROL_NAMES)
                    .map(|_| s.barrier_async())
                    .collect::<Result<Vec<_>, Error>>()?;
                handles.into_iter().try_for_each(|h| h.wait())
            })?;
            Ok::<_, Error>(kolo.stats().cache_hits)
        })
        .expect("the barriers run");
        for h in hits {
            assert!(h >= 2 * CONTROL_NAMES, "{h} cache hits");
        }
    }
}
