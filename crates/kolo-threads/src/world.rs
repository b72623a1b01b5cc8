//! Everything the ranks of one communicator share.

use crate::backoff::Backoff;
use crate::barrier::{Barrier, Wait};
use crate::health::Health;
use crate::mailbox::Mailboxes;
use crate::shared::Slots;
use kolo_transport::TransportError;

/// The shared state of a communicator: one per [`crate::communicators`]
/// call, held by every rank's [`crate::ThreadComm`].
#[derive(Debug)]
pub(crate) struct World {
    pub(crate) size: usize,
    pub(crate) barrier: Barrier,
    pub(crate) health: Health,
    pub(crate) mail: Mailboxes,
    pub(crate) slots: Slots,
    pub(crate) backoff: Backoff,
}

impl World {
    /// A world of `size` ranks on a machine with `cores` cores.
    pub(crate) fn new(size: usize, cores: usize) -> Self {
        World {
            size,
            barrier: Barrier::new(size),
            health: Health::new(size),
            mail: Mailboxes::new(size),
            slots: Slots::new(size),
            backoff: Backoff::for_ranks(size, cores),
        }
    }

    /// Marks `rank` down (once) and wakes every waiter to notice.
    pub(crate) fn mark_down(&self, rank: usize, message: String) {
        if self.health.mark(rank, message, self.barrier.generation()) {
            self.barrier.wake_all();
            self.mail.wake_all();
        }
    }

    /// Arrives at the barrier and waits (see [`Wait`]).
    pub(crate) fn barrier_wait(&self, mode: Wait) -> Result<(), TransportError> {
        self.barrier.wait(&self.health, &self.backoff, mode)
    }
}
