//! The host data plane over MPI: MPI's own collectives on the private data
//! communicator; f16 / bf16 through kolo's datatypes and user operations;
//! average as sum then scale.

use crate::comm::MpiComm;
use crate::raw::{collective, counts_displs, p2p};
use kolo_protocol::ReduceOp;
use kolo_transport::{
    Collectives, Element, Result, Scale, Topology, Transaction, TransportError, TxOp,
};
use std::os::raw::c_int;

/// Elements per MPI call for operations split into chunks (MPI counts are ints).
const MAX_CHUNK: usize = (c_int::MAX as usize) / 2;

impl MpiComm {
    /// The postscale that also divides by `size` for `Average`.
    fn post_factor(&self, op: ReduceOp, scale: Scale) -> f64 {
        if op == ReduceOp::Average {
            scale.postscale / self.size() as f64
        } else {
            scale.postscale
        }
    }

    fn check_counts(&self, counts: &[usize], what: &str) -> Result<usize> {
        if counts.len() != self.size() {
            return Err(TransportError::InvalidArgument(format!(
                "{what}: {} counts given for {} ranks",
                counts.len(),
                self.size()
            )));
        }
        Ok(counts.iter().sum())
    }
}

fn check_len(what: &str, name: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(TransportError::InvalidArgument(format!(
            "{what}: {name} holds {got} elements but the counts require {want}"
        )));
    }
    Ok(())
}

impl Collectives for MpiComm {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        let peer = self.check_peer(peer, "send")?;
        let tag = self.check_tag(tag)?;
        let dtype = self.types.datatype(T::DTYPE);
        // SAFETY: the data communicator and `dtype` (T's datatype) are live
        // while `self` is.
        unsafe { p2p::send(buf, dtype, peer, tag, self.data.handle()) }
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        let peer_c = self.check_peer(peer, "recv")?;
        let tag_c = self.check_tag(tag)?;
        let dtype = self.types.datatype(T::DTYPE);
        let comm = self.data.handle();
        // Probe first so a message of another length is reported, not truncated.
        // SAFETY: the data communicator and `dtype` are live while `self` is;
        // the status comes from the probe.
        let incoming = unsafe {
            let status = p2p::probe(peer_c, tag_c, comm)?;
            p2p::get_count(&status, dtype)?
        };
        let incoming = incoming.max(0) as usize;
        let expected = buf.len();
        let mismatch = incoming != expected;
        let mut scratch = Vec::new();
        let target: &mut [T] = if mismatch {
            // Consume the message so the pair stays in step, then report.
            scratch.resize(incoming, T::default());
            &mut scratch
        } else {
            buf
        };
        // SAFETY: as above; `target` has room for the probed message.
        unsafe { p2p::recv(target, dtype, peer_c, tag_c, comm) }?;
        if mismatch {
            return Err(TransportError::InvalidArgument(format!(
                "recv from rank {peer} with tag {tag}: expected {expected} elements, the message holds {incoming}"
            )));
        }
        Ok(())
    }

    fn sendrecv<T: Element>(
        &mut self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
        tag: u32,
    ) -> Result<()> {
        let dst = self.check_peer(dst, "sendrecv")?;
        let src = self.check_peer(src, "sendrecv")?;
        let tag = self.check_tag(tag)?;
        let dtype = self.types.datatype(T::DTYPE);
        // SAFETY: the data communicator and `dtype` (T's datatype) are live
        // while `self` is.
        unsafe { p2p::sendrecv(send, dst, recv, src, dtype, tag, self.data.handle()) }
    }

    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()> {
        if scale.prescale != 1.0 {
            T::scale(buf, scale.prescale);
        }
        let dtype = self.types.datatype(T::DTYPE);
        let mpi_op = self.types.op(T::DTYPE, op)?;
        for chunk in buf.chunks_mut(MAX_CHUNK) {
            // SAFETY: the data communicator, `dtype` and `mpi_op` (T's) are
            // live while `self` is; every rank splits the same length into
            // the same chunks.
            unsafe { collective::allreduce_in_place(chunk, dtype, mpi_op, self.data.handle()) }?;
        }
        let post = self.post_factor(op, scale);
        if post != 1.0 {
            T::scale(buf, post);
        }
        Ok(())
    }

    fn allgatherv<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        let total = self.check_counts(counts, "allgatherv")?;
        check_len("allgatherv", "send", send.len(), counts[self.rank()])?;
        check_len("allgatherv", "recv", recv.len(), total)?;
        let (c, d) = counts_displs(counts, "allgatherv")?;
        let dtype = self.types.datatype(T::DTYPE);
        // SAFETY: the handles are live while `self` is; one count per rank,
        // and the lengths were checked against them above.
        unsafe { collective::allgatherv(send, recv, &c, &d, dtype, self.data.handle()) }
    }

    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let root = self.check_peer(root, "broadcast root")?;
        let dtype = self.types.datatype(T::DTYPE);
        for chunk in buf.chunks_mut(MAX_CHUNK) {
            // SAFETY: the handles are live while `self` is; every rank
            // splits the same length into the same chunks.
            unsafe { collective::bcast(chunk, dtype, root, self.data.handle()) }?;
        }
        Ok(())
    }

    fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        let total = self.check_counts(counts, "reduce_scatter")?;
        check_len("reduce_scatter", "send", send.len(), total)?;
        check_len("reduce_scatter", "recv", recv.len(), counts[self.rank()])?;
        let (c, _) = counts_displs(counts, "reduce_scatter")?;
        let scaled;
        let input: &[T] = if scale.prescale != 1.0 {
            let mut copy = send.to_vec();
            T::scale(&mut copy, scale.prescale);
            scaled = copy;
            &scaled
        } else {
            send
        };
        let dtype = self.types.datatype(T::DTYPE);
        let mpi_op = self.types.op(T::DTYPE, op)?;
        // SAFETY: the handles are live while `self` is; one count per rank,
        // `input` holds their sum and `recv` this rank's (checked above).
        unsafe { collective::reduce_scatter(input, recv, &c, dtype, mpi_op, self.data.handle()) }?;
        let post = self.post_factor(op, scale);
        if post != 1.0 {
            T::scale(recv, post);
        }
        Ok(())
    }

    fn alltoallv<T: Element>(
        &mut self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let send_total = self.check_counts(send_counts, "alltoallv send")?;
        let recv_total = self.check_counts(recv_counts, "alltoallv recv")?;
        check_len("alltoallv", "send", send.len(), send_total)?;
        check_len("alltoallv", "recv", recv.len(), recv_total)?;
        let (sc, sd) = counts_displs(send_counts, "alltoallv")?;
        let (rc, rd) = counts_displs(recv_counts, "alltoallv")?;
        let dtype = self.types.datatype(T::DTYPE);
        // SAFETY: the handles are live while `self` is; one count per rank
        // on each side, and the buffers hold their sums (checked above).
        unsafe { collective::alltoallv(send, &sc, &sd, recv, &rc, &rd, dtype, self.data.handle()) }
    }

    fn barrier(&mut self) -> Result<()> {
        // SAFETY: the data communicator is live while `self` is.
        unsafe { collective::barrier(self.data.handle()) }
    }

    /// Collectives in scheduled order, then every receive and send posted
    /// non-blocking and completed together (MPI's sends may wait for their
    /// receiver, so the default's sends-first order could deadlock).
    fn execute<T: Element>(&mut self, tx: Transaction<'_, T>) -> Result<()> {
        let size = self.size();
        let mut p2p = Vec::new();
        for op in tx.into_ops() {
            match op {
                TxOp::ReduceScatter {
                    send,
                    recv,
                    op,
                    scale,
                } => {
                    let counts = vec![recv.len(); size];
                    self.reduce_scatter(send, recv, &counts, op, scale)?;
                }
                TxOp::AllGather { send, recv } => {
                    let counts = vec![send.len(); size];
                    self.allgatherv(send, recv, &counts)?;
                }
                other => p2p.push(other),
            }
        }
        // Every peer and tag is checked before anything is posted, so a bad
        // one fails the transaction before MPI holds any of its buffers.
        let mut recvs = Vec::new();
        let mut sends = Vec::new();
        for op in p2p {
            match op {
                TxOp::Recv { buf, peer, tag } => {
                    recvs.push((buf, self.check_peer(peer, "recv")?, self.check_tag(tag)?));
                }
                TxOp::Send { buf, peer, tag } => {
                    sends.push((buf, self.check_peer(peer, "send")?, self.check_tag(tag)?));
                }
                TxOp::ReduceScatter { .. } | TxOp::AllGather { .. } => {}
            }
        }
        let dtype = self.types.datatype(T::DTYPE);
        let comm = self.data.handle();
        let mut requests = Vec::with_capacity(recvs.len() + sends.len());
        // Receives are posted before sends so every send finds its match.
        let receives = recvs.iter_mut().map(|(buf, peer, tag)| {
            // SAFETY: the handles are live while `self` is; `buf` stays
            // borrowed by `recvs`, untouched, until the requests complete
            // in `p2p::waitall` below, on every path out of this function.
            unsafe { p2p::irecv(buf, dtype, *peer, *tag, comm) }
        });
        let sending = sends.iter().map(|(buf, peer, tag)| {
            // SAFETY: as above, `buf` borrowed by `sends`.
            unsafe { p2p::isend(buf, dtype, *peer, *tag, comm) }
        });
        for posted in receives.chain(sending) {
            match posted {
                Ok(request) => requests.push(request),
                Err(e) => {
                    // The buffers go back to the caller: MPI must be done
                    // with what it already holds.
                    // SAFETY: each request came from the posts above and is
                    // completed here once.
                    let _ = unsafe { p2p::waitall(&mut requests) };
                    return Err(e);
                }
            }
        }
        // SAFETY: each request came from the posts above and is completed
        // here once.
        unsafe { p2p::waitall(&mut requests) }
    }
}
