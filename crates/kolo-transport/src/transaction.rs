//! Transactions (LLMQ): several operations scheduled, then issued together.

use crate::element::Element;
use crate::error::Result;
use crate::memory::{Host, Memory};
use crate::traits::{Collectives, Scale};
use crate::TransportError;
use kolo_protocol::ReduceOp;

/// One operation scheduled into a [`Transaction`] on memory `M` (host
/// memory unless said otherwise).
#[derive(Debug)]
pub enum TxOp<'a, T: Element, M: Memory = Host> {
    /// Even reduce-scatter: `recv.len() * size == send.len()`.
    ReduceScatter {
        /// Every rank's full input.
        send: M::Ref<'a, T>,
        /// This rank's reduced block.
        recv: M::Mut<'a, T>,
        /// The reduction.
        op: ReduceOp,
        /// Factors around it.
        scale: Scale,
    },
    /// Even all-gather: `send.len() * size == recv.len()`.
    AllGather {
        /// This rank's block.
        send: M::Ref<'a, T>,
        /// Every rank's block, in rank order.
        recv: M::Mut<'a, T>,
    },
    /// Point-to-point send.
    Send {
        /// The data.
        buf: M::Ref<'a, T>,
        /// The receiving rank.
        peer: usize,
        /// The message tag.
        tag: u32,
    },
    /// Point-to-point receive.
    Recv {
        /// Where the data goes (its length is the message's).
        buf: M::Mut<'a, T>,
        /// The sending rank.
        peer: usize,
        /// The message tag.
        tag: u32,
    },
}

/// Operations collected between `begin` ([`Transaction::new`]) and
/// [`Collectives::execute`].
#[derive(Debug)]
pub struct Transaction<'a, T: Element, M: Memory = Host> {
    ops: Vec<TxOp<'a, T, M>>,
}

impl<T: Element, M: Memory> Default for Transaction<'_, T, M> {
    fn default() -> Self {
        Transaction { ops: Vec::new() }
    }
}

impl<'a, T: Element, M: Memory> Transaction<'a, T, M> {
    /// Schedules an even reduce-scatter (`recv.len() * size == send.len()`).
    pub fn reduce_scatter(
        &mut self,
        send: M::Ref<'a, T>,
        recv: M::Mut<'a, T>,
        op: ReduceOp,
        scale: Scale,
    ) -> &mut Self {
        self.ops.push(TxOp::ReduceScatter {
            send,
            recv,
            op,
            scale,
        });
        self
    }

    /// Schedules an even all-gather (`send.len() * size == recv.len()`).
    pub fn all_gather(&mut self, send: M::Ref<'a, T>, recv: M::Mut<'a, T>) -> &mut Self {
        self.ops.push(TxOp::AllGather { send, recv });
        self
    }

    /// Schedules a send of `buf` to `peer` with `tag`.
    pub fn send(&mut self, buf: M::Ref<'a, T>, peer: usize, tag: u32) -> &mut Self {
        self.ops.push(TxOp::Send { buf, peer, tag });
        self
    }

    /// Schedules a receive of `buf`'s length of elements from `peer` with
    /// `tag`.
    pub fn recv(&mut self, buf: M::Mut<'a, T>, peer: usize, tag: u32) -> &mut Self {
        self.ops.push(TxOp::Recv { buf, peer, tag });
        self
    }

    /// Number of scheduled operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The scheduled operations, in order.
    pub fn into_ops(self) -> Vec<TxOp<'a, T, M>> {
        self.ops
    }
}

impl<'a, T: Element> Transaction<'a, T, Host> {
    /// Begins an empty transaction on host memory (on another memory:
    /// `Transaction::default()`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the transaction on `comm` one operation at a time: collectives in
    /// scheduled order, then the point-to-point operations. When the
    /// transaction has as many sends as receives and the k-th send and k-th
    /// receive share a tag (the ring and pairwise exchanges transactions
    /// are made of), each such pair runs as one [`Collectives::sendrecv`],
    /// which is deadlock-free even where `send` waits for its receiver (MPI's
    /// rendezvous sends). Otherwise every send runs, then every receive,
    /// which needs sends that complete without the receiver. Backends with
    /// buffered sends use [`Transaction::run_buffered`]; backends with
    /// native groups (NCCL, MPI's non-blocking calls) override
    /// [`Collectives::execute`].
    pub fn run_default<C: Collectives>(self, comm: &mut C) -> Result<()> {
        let (sends, recvs) = self.run_collectives(comm)?;
        let pairable = sends.len() == recvs.len()
            && sends
                .iter()
                .zip(&recvs)
                .all(|((_, _, a), (_, _, b))| a == b);
        if !pairable {
            return run_sends_then_recvs(comm, sends, recvs);
        }
        for ((buf, dst, tag), (incoming, src, _)) in sends.into_iter().zip(recvs) {
            comm.sendrecv(buf, dst, incoming, src, tag)?;
        }
        Ok(())
    }

    /// Runs the transaction for a backend whose `send` never waits for its
    /// receiver (kolo-threads' buffered mailboxes): collectives in order,
    /// then every send, then every receive — any matching order works.
    pub fn run_buffered<C: Collectives>(self, comm: &mut C) -> Result<()> {
        let (sends, recvs) = self.run_collectives(comm)?;
        run_sends_then_recvs(comm, sends, recvs)
    }

    /// Runs the collectives in scheduled order and returns the
    /// point-to-point operations, sends and receives apart, in order.
    #[allow(clippy::type_complexity)]
    fn run_collectives<C: Collectives>(
        self,
        comm: &mut C,
    ) -> Result<(Vec<(&'a [T], usize, u32)>, Vec<(&'a mut [T], usize, u32)>)> {
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for op in self.ops {
            match op {
                TxOp::ReduceScatter {
                    send,
                    recv,
                    op,
                    scale,
                } => {
                    let counts = even_counts(send.len(), recv.len(), comm.size())?;
                    comm.reduce_scatter(send, recv, &counts, op, scale)?;
                }
                TxOp::AllGather { send, recv } => {
                    let counts = even_counts(recv.len(), send.len(), comm.size())?;
                    comm.allgatherv(send, recv, &counts)?;
                }
                TxOp::Send { buf, peer, tag } => sends.push((buf, peer, tag)),
                TxOp::Recv { buf, peer, tag } => recvs.push((buf, peer, tag)),
            }
        }
        Ok((sends, recvs))
    }
}

/// Every send, then every receive.
#[allow(clippy::type_complexity)]
fn run_sends_then_recvs<C: Collectives, T: Element>(
    comm: &mut C,
    sends: Vec<(&[T], usize, u32)>,
    recvs: Vec<(&mut [T], usize, u32)>,
) -> Result<()> {
    for (buf, peer, tag) in sends {
        comm.send(buf, peer, tag)?;
    }
    for (buf, peer, tag) in recvs {
        comm.recv(buf, peer, tag)?;
    }
    Ok(())
}

/// `size` equal blocks of `part` elements that tile `total`.
fn even_counts(total: usize, part: usize, size: usize) -> Result<Vec<usize>> {
    if part.checked_mul(size) != Some(total) {
        return Err(TransportError::InvalidArgument(format!(
            "transaction: {size} blocks of {part} elements do not make the {total} elements given"
        )));
    }
    Ok(vec![part; size])
}
