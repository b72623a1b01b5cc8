//! Barrier and join.

use super::output;
use crate::engine::submission::Input;
use crate::error::Error;
use crate::handle::Handle;
use crate::kolo::Kolo;
use kolo_protocol::{DataType, RequestKind};

impl Kolo {
    /// Returns once every rank has entered the barrier (negotiated like any
    /// operation, then a barrier on the backend).
    pub fn barrier(&self) -> Result<(), Error> {
        self.barrier_async()?.wait()
    }

    /// [`Kolo::barrier`] without blocking.
    pub fn barrier_async(&self) -> Result<Handle<'static, ()>, Error> {
        let name = self.next_barrier_name();
        self.control(name, RequestKind::Barrier)
    }

    /// Declares that this rank has no more batches (Horovod's join): until
    /// every rank has joined, this rank takes part in the other ranks'
    /// allreduces, allgathers and broadcasts, contributing the reduce op's
    /// identity (zero for a sum) or zero rows, so that ranks with fewer
    /// batches need not invent data. Returns, once every rank has joined,
    /// the last rank to join (the same on every rank, as Horovod's `join`;
    /// of ranks that joined in the same negotiation cycle, the highest).
    pub fn join(&self) -> Result<usize, Error> {
        self.join_async()?.wait()
    }

    /// [`Kolo::join`] without blocking.
    pub fn join_async(&self) -> Result<Handle<'static, usize>, Error> {
        let name = self.next_join_name();
        let completion =
            self.submit_one(&name, self.control_params(RequestKind::Join), Input::None)?;
        Ok(Handle::new(completion, move |payloads| {
            output::<usize>(&name, payloads.into_iter().next())
        }))
    }

    fn control(&self, name: String, kind: RequestKind) -> Result<Handle<'static, ()>, Error> {
        let completion = self.submit_one(&name, self.control_params(kind), Input::None)?;
        Ok(Handle::new(completion, |_| Ok(())))
    }

    fn control_params(&self, kind: RequestKind) -> kolo_protocol::Params {
        self.params(kind, DataType::U8, &[])
    }
}
