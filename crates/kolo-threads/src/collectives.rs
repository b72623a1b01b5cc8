//! The data plane of [`ThreadComm`]: every method of [`Collectives`] with
//! its shared-memory implementation.

use crate::call::Kind;
use crate::comm::ThreadComm;
use crate::{allreduce, allreduce_segments, control, exchange};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Element, MemoryKind, Result, Scale, Topology, Transaction};

/// The size from which `sendrecv` lends its send buffer (one copy)
/// instead of copying it into the mailbox (two copies, but no wait for the
/// receiver).
pub(crate) const LEND_BYTES: usize = 32 << 10;

impl Topology for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.world.size
    }

    /// Every rank of a threads communicator is on this host.
    fn local_rank(&self) -> usize {
        self.rank
    }

    fn local_size(&self) -> usize {
        self.world.size
    }
}

impl Collectives for ThreadComm {
    fn memory(&self) -> MemoryKind {
        MemoryKind::Host
    }

    /// Copies `buf` straight into the peer's posted receive, or, if it has
    /// none yet, into the (this rank, `peer`, `tag`) mailbox; never waits
    /// for the receiver.
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.check_peer(peer, "send")?;
        self.world.mail.send(self.rank, peer, tag, buf)
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.check_peer(peer, "recv")?;
        let world = &self.world;
        let result = world
            .mail
            .recv(self.rank, peer, tag, buf, &world.health, &world.backoff);
        self.observe(result)
    }

    /// Small messages are sent eagerly (buffered, so sending first never
    /// deadlocks). From 32 KiB on, `send` is lent to `dst`, which
    /// copies it straight into its receive buffer (one copy instead of two
    /// and no allocation); the call then returns once `dst` has copied it,
    /// as MPI's rendezvous sends do.
    fn sendrecv<T: Element>(
        &mut self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
        tag: u32,
    ) -> Result<()> {
        if std::mem::size_of_val(send) < LEND_BYTES {
            self.send(send, dst, tag)?;
            return self.recv(recv, src, tag);
        }
        self.check_peer(dst, "sendrecv")?;
        self.check_peer(src, "sendrecv")?;
        let (world, rank) = (&self.world, self.rank);
        let (health, backoff) = (&world.health, &world.backoff);
        let loan = world.mail.lend(rank, dst, tag, send, health, backoff)?;
        let received = world.mail.recv(rank, src, tag, recv, health, backoff);
        // Wait for `dst` only if this rank's own receive worked; otherwise
        // take the loan back (the call fails anyway).
        let sent = loan.settle(received.is_ok());
        self.observe(received.and(sent))
    }

    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()> {
        let result = allreduce::allreduce(self, buf, op, scale);
        self.observe(result)
    }

    /// True: [`Collectives::allreduce_segments`] is one round over the
    /// segments where they lie.
    fn reduces_segments_in_place(&self) -> bool {
        true
    }

    /// One round straight over the segments, no fusion buffer: each rank
    /// publishes a table of its segments, the opening barrier checks that
    /// every rank passed the same segment lengths (and element type, op and
    /// scale), and the segments are reduced as one virtual buffer, their
    /// concatenation: on the small path into the scratch and back, on the
    /// in-place path chunk by chunk straight between the ranks' segments.
    /// The result is bit for bit that of `allreduce` over the packed
    /// concatenation.
    fn allreduce_segments<T: Element>(
        &mut self,
        segments: &mut [&mut [T]],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        let result = allreduce_segments::allreduce_segments(self, segments, op, scale);
        self.observe(result)
    }

    fn allgatherv<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        self.observe(exchange::allgatherv(
            &self.world,
            self.rank,
            send,
            recv,
            counts,
        ))
    }

    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        self.observe(exchange::broadcast(&self.world, self.rank, buf, root))
    }

    fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        let result = allreduce::reduce_scatter(self, send, recv, counts, op, scale);
        self.observe(result)
    }

    fn alltoallv<T: Element>(
        &mut self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let result =
            exchange::alltoallv(&self.world, self.rank, send, send_counts, recv, recv_counts);
        self.observe(result)
    }

    fn barrier(&mut self) -> Result<()> {
        self.observe(control::barrier(&self.world, self.rank, Kind::Barrier))
    }

    /// Sends are buffered, so the default order (collectives, then sends,
    /// then receives) cannot deadlock.
    fn execute<T: Element>(&mut self, tx: Transaction<'_, T>) -> Result<()> {
        tx.run_buffered(self)
    }
}
