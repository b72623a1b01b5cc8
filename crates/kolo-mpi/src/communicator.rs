//! [`Communicator`]: an MPI communicator kolo-mpi made, which returns its
//! errors to kolo and is freed when dropped.

use crate::raw::{self, Comm};
use kolo_transport::Result;
use mpi::topology::SimpleCommunicator;
use mpi::traits::AsRaw;
use std::os::raw::c_int;

/// An owned communicator. Its handle is the crate's to pass to [`raw`]
/// calls while it lives; MPI errors on it come back as return codes
/// (`MPI_ERRORS_RETURN`), which [`raw`] turns into errors.
pub(crate) struct Communicator(Comm);

impl Communicator {
    /// A duplicate of rsmpi's world. Collective over the world.
    pub(crate) fn duplicate_world(world: &SimpleCommunicator) -> Result<Communicator> {
        // SAFETY: rsmpi's world is live while its universe is, which the
        // caller holds; the duplicate is owned (and freed) by the result.
        Communicator::adopt(unsafe { raw::comm::dup(world.as_raw()) }?)
    }

    /// A duplicate (`MPI_Comm_dup`). Collective over this communicator.
    pub(crate) fn duplicate(&self) -> Result<Communicator> {
        // SAFETY: `self.0` is live while `self` is; the duplicate is owned
        // by the result.
        Communicator::adopt(unsafe { raw::comm::dup(self.0) }?)
    }

    /// `MPI_Comm_split`: `None` for a rank passing no color. Collective
    /// over this communicator.
    pub(crate) fn split(&self, color: Option<c_int>, key: c_int) -> Result<Option<Communicator>> {
        // SAFETY: `self.0` is live; the new communicator is owned by the
        // result.
        unsafe { raw::comm::split(self.0, color, key) }?
            .map(Communicator::adopt)
            .transpose()
    }

    /// `MPI_Comm_create_group` of `members`. Collective over the members.
    pub(crate) fn create_group(&self, members: &[c_int], tag: c_int) -> Result<Communicator> {
        // SAFETY: `self.0` is live; the new communicator is owned by the
        // result.
        Communicator::adopt(unsafe { raw::comm::create_group(self.0, members, tag) }?)
    }

    /// This communicator's (rank, size), and its local (rank, size) from a
    /// shared-memory split of it. Collective over this communicator.
    pub(crate) fn topology(&self) -> Result<((usize, usize), (usize, usize))> {
        let global = self.rank_size()?;
        // SAFETY: `self.0` is live; the split is owned by `local`.
        let local = Communicator::adopt(unsafe { raw::comm::split_shared(self.0) }?)?;
        Ok((global, local.rank_size()?))
    }

    fn rank_size(&self) -> Result<(usize, usize)> {
        // SAFETY: `self.0` is live.
        let (rank, size) = unsafe { (raw::comm::rank(self.0)?, raw::comm::size(self.0)?) };
        Ok((rank.max(0) as usize, size.max(0) as usize))
    }

    /// The handle, for [`raw`] calls while `self` lives.
    pub(crate) fn handle(&self) -> Comm {
        self.0
    }

    /// Takes ownership of `comm`, just created, and makes it return errors
    /// to kolo instead of aborting the job inside MPI.
    fn adopt(comm: Comm) -> Result<Communicator> {
        let comm = Communicator(comm);
        // SAFETY: `comm.0` is live; on failure, dropping `comm` frees it.
        unsafe { raw::comm::set_errors_return(comm.0) }?;
        Ok(comm)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if crate::runtime::is_active() {
            // SAFETY: `self.0` was created by MPI for this value alone, MPI is
            // still initialised, and nothing uses the handle after this.
            // A failure to free cannot be reported from a drop; MPI reclaims
            // the communicator at finalisation.
            let _ = unsafe { raw::comm::free(self.0) };
        }
    }
}
