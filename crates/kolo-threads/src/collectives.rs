//! The data plane of [`ThreadComm`]: every method of [`Collectives`] with
//! its shared-memory implementation.

use crate::call::Kind;
use crate::comm::ThreadComm;
use crate::mailbox::Message;
use crate::{allreduce, control, exchange};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Element, MemoryKind, Result, Scale, Topology, Transaction};

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

    /// Copies `buf` into the (this rank, `peer`, `tag`) mailbox and returns
    /// without waiting for the receiver.
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.check_peer(peer, "send")?;
        self.world
            .mail
            .post(self.rank, peer, tag, Message::new(buf));
        Ok(())
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.check_peer(peer, "recv")?;
        let world = &self.world;
        let result = world
            .mail
            .take(self.rank, peer, tag, &world.health, &world.backoff)
            .and_then(|message| {
                message.copy_into(buf, || format!("recv from rank {peer} with tag {tag}"))
            });
        self.observe(result)
    }

    /// Sends are buffered, so sending first never deadlocks.
    fn sendrecv<T: Element>(
        &mut self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
        tag: u32,
    ) -> Result<()> {
        self.send(send, dst, tag)?;
        self.recv(recv, src, tag)
    }

    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()> {
        let result = allreduce::allreduce(self, buf, op, scale);
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
