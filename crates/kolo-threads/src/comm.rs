//! One rank's handle on a communicator.

use crate::scratch::Scratch;
use crate::shared::SegmentTable;
use crate::world::World;
use kolo_transport::TransportError;
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::thread;

/// One rank of an in-process communicator: implements
/// [`kolo_transport::Topology`], [`kolo_transport::Controller`] and
/// [`kolo_transport::Collectives`] on shared memory.
///
/// `Send` but not `Sync`: each rank lives on one thread at a time. Dropping
/// it marks the rank as departed: a peer that waits on it afterwards gets
/// `PeerFailed` naming it ("rank 2 left the communicator"), while the
/// messages it sent before are still delivered.
pub struct ThreadComm {
    pub(crate) world: Arc<World>,
    pub(crate) rank: usize,
    pub(crate) scratch: Scratch,
    /// The table `allreduce_segments` publishes, refilled by every call.
    pub(crate) segments: SegmentTable,
    /// Set when a call of this rank failed because a peer did.
    followed_peer: Cell<bool>,
}

impl ThreadComm {
    pub(crate) fn new(world: Arc<World>, rank: usize) -> Self {
        ThreadComm {
            world,
            rank,
            scratch: Scratch::default(),
            segments: SegmentTable::default(),
            followed_peer: Cell::new(false),
        }
    }

    /// Marks this rank failed: every peer blocked on it (now or later) gets
    /// `PeerFailed { rank, message }`. Only the first failure (or
    /// departure) of a rank is recorded.
    pub fn fail(&self, message: impl Into<String>) {
        self.world.mark_down(self.rank, message.into());
    }

    /// Passes `result` through, remembering whether it was a peer's failure.
    pub(crate) fn observe<T>(
        &self,
        result: Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        if let Err(TransportError::PeerFailed { .. }) = &result {
            self.followed_peer.set(true);
        }
        result
    }

    /// True if some call of this rank failed because a peer had failed.
    pub(crate) fn followed_peer(&self) -> bool {
        self.followed_peer.get()
    }

    /// `InvalidArgument` unless `peer` is a rank of this communicator.
    pub(crate) fn check_peer(&self, peer: usize, what: &str) -> Result<(), TransportError> {
        if peer < self.world.size {
            Ok(())
        } else {
            Err(TransportError::InvalidArgument(format!(
                "{what}: peer {peer} is not a rank of this {}-rank communicator",
                self.world.size
            )))
        }
    }
}

impl fmt::Debug for ThreadComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadComm")
            .field("rank", &self.rank)
            .field("size", &self.world.size)
            .finish_non_exhaustive()
    }
}

impl Drop for ThreadComm {
    fn drop(&mut self) {
        let message = if thread::panicking() {
            format!("rank {} panicked and left the communicator", self.rank)
        } else {
            format!("rank {} left the communicator", self.rank)
        };
        self.world.mark_down(self.rank, message);
    }
}
