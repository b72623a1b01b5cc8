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
    /// Submits a barrier (see [`Kolo::barrier`]).
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
    /// the last rank to join.
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
