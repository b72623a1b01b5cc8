//! The host data plane over MPI: MPI's own collectives on the private data
//! communicator; f16 / bf16 through kolo's datatypes and user operations;
//! average as sum then scale.

use crate::comm::MpiComm;
use crate::raw::{check, counts_displs, recv_ptr, send_ptr, to_int};
use kolo_protocol::ReduceOp;
use kolo_transport::{
    Collectives, Element, Result, Scale, Topology, Transaction, TransportError, TxOp,
};
use mpi::ffi;
use std::os::raw::{c_int, c_void};

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
        let count = to_int(buf.len(), "send")?;
        // SAFETY: `buf` holds `count` elements of the datatype matching T.
        check(
            unsafe {
                ffi::MPI_Send(
                    send_ptr(buf),
                    count,
                    self.types.datatype(T::DTYPE),
                    peer,
                    tag,
                    self.data,
                )
            },
            "MPI_Send",
        )
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        let peer_c = self.check_peer(peer, "recv")?;
        let tag_c = self.check_tag(tag)?;
        let dtype = self.types.datatype(T::DTYPE);
        // Probe first so a message of another length is reported, not truncated.
        // SAFETY: MPI_Status is plain data that MPI_Probe fills in.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: valid communicator and status out-pointer.
        check(
            unsafe { ffi::MPI_Probe(peer_c, tag_c, self.data, &mut status) },
            "MPI_Probe",
        )?;
        let mut incoming: c_int = 0;
        // SAFETY: `status` was filled by MPI_Probe.
        check(
            unsafe { ffi::MPI_Get_count(&status, dtype, &mut incoming) },
            "MPI_Get_count",
        )?;
        let incoming = incoming.max(0) as usize;
        let mismatch = incoming != buf.len();
        let mut scratch = Vec::new();
        let target: *mut c_void = if mismatch {
            // Consume the message so the pair stays in step, then report.
            scratch.resize(incoming, T::default());
            recv_ptr(&mut scratch)
        } else {
            recv_ptr(buf)
        };
        let count = to_int(incoming, "recv")?;
        // SAFETY: `target` holds `incoming` elements of T, the probed size.
        check(
            unsafe {
                ffi::MPI_Recv(
                    target,
                    count,
                    dtype,
                    peer_c,
                    tag_c,
                    self.data,
                    ffi::RSMPI_STATUS_IGNORE,
                )
            },
            "MPI_Recv",
        )?;
        if mismatch {
            return Err(TransportError::InvalidArgument(format!(
                "recv from rank {peer} with tag {tag}: expected {} elements, the message holds {incoming}",
                buf.len()
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
        let (sc, rc) = (
            to_int(send.len(), "sendrecv")?,
            to_int(recv.len(), "sendrecv")?,
        );
        // SAFETY: both buffers hold the element counts passed.
        check(
            unsafe {
                ffi::MPI_Sendrecv(
                    send_ptr(send),
                    sc,
                    dtype,
                    dst,
                    tag,
                    recv_ptr(recv),
                    rc,
                    dtype,
                    src,
                    tag,
                    self.data,
                    ffi::RSMPI_STATUS_IGNORE,
                )
            },
            "MPI_Sendrecv",
        )
    }

    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()> {
        if scale.prescale != 1.0 {
            T::scale(buf, scale.prescale);
        }
        let dtype = self.types.datatype(T::DTYPE);
        let mpi_op = self.types.op(T::DTYPE, op)?;
        for chunk in buf.chunks_mut(MAX_CHUNK) {
            // SAFETY: in place over `chunk.len()` (< int max) elements of T.
            check(
                unsafe {
                    ffi::MPI_Allreduce(
                        self.in_place,
                        recv_ptr(chunk),
                        chunk.len() as c_int,
                        dtype,
                        mpi_op,
                        self.data,
                    )
                },
                "MPI_Allreduce",
            )?;
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
        // SAFETY: lengths checked against `counts` above.
        check(
            unsafe {
                ffi::MPI_Allgatherv(
                    send_ptr(send),
                    c[self.rank()],
                    dtype,
                    recv_ptr(recv),
                    c.as_ptr(),
                    d.as_ptr(),
                    dtype,
                    self.data,
                )
            },
            "MPI_Allgatherv",
        )
    }

    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let root = self.check_peer(root, "broadcast root")?;
        let dtype = self.types.datatype(T::DTYPE);
        for chunk in buf.chunks_mut(MAX_CHUNK) {
            // SAFETY: `chunk.len()` elements of T in place.
            check(
                unsafe {
                    ffi::MPI_Bcast(
                        recv_ptr(chunk),
                        chunk.len() as c_int,
                        dtype,
                        root,
                        self.data,
                    )
                },
                "MPI_Bcast",
            )?;
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
        // SAFETY: `input` holds sum(counts) elements, `recv` counts[rank].
        check(
            unsafe {
                ffi::MPI_Reduce_scatter(
                    send_ptr(input),
                    recv_ptr(recv),
                    c.as_ptr(),
                    dtype,
                    mpi_op,
                    self.data,
                )
            },
            "MPI_Reduce_scatter",
        )?;
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
        // SAFETY: buffer lengths checked against the counts above.
        check(
            unsafe {
                ffi::MPI_Alltoallv(
                    send_ptr(send),
                    sc.as_ptr(),
                    sd.as_ptr(),
                    dtype,
                    recv_ptr(recv),
                    rc.as_ptr(),
                    rd.as_ptr(),
                    dtype,
                    self.data,
                )
            },
            "MPI_Alltoallv",
        )
    }

    fn barrier(&mut self) -> Result<()> {
        // SAFETY: a barrier on our data communicator.
        check(unsafe { ffi::MPI_Barrier(self.data) }, "MPI_Barrier")
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
        let dtype = self.types.datatype(T::DTYPE);
        // SAFETY: MPI_Request is a plain handle MPI overwrites.
        let mut requests: Vec<ffi::MPI_Request> = Vec::with_capacity(p2p.len());
        let mut post = |result: c_int, req: ffi::MPI_Request, what: &str| -> Result<()> {
            check(result, what)?;
            requests.push(req);
            Ok(())
        };
        // Receives are posted before sends so every send finds its match.
        let mut ordered: Vec<TxOp<'_, T>> = Vec::with_capacity(p2p.len());
        let (recvs, sends): (Vec<_>, Vec<_>) = p2p
            .into_iter()
            .partition(|o| matches!(o, TxOp::Recv { .. }));
        ordered.extend(recvs);
        ordered.extend(sends);
        for op in &mut ordered {
            // SAFETY: a request handle is plain data that MPI fills in.
            let mut req: ffi::MPI_Request = unsafe { std::mem::zeroed() };
            match op {
                TxOp::Recv { buf, peer, tag } => {
                    let (p, t, n) = (
                        self.check_peer(*peer, "recv")?,
                        self.check_tag(*tag)?,
                        to_int(buf.len(), "recv")?,
                    );
                    // SAFETY: `buf` outlives the Waitall below (it borrows
                    // from `ordered`, alive until this function returns).
                    let rc = unsafe {
                        ffi::MPI_Irecv(recv_ptr(buf), n, dtype, p, t, self.data, &mut req)
                    };
                    post(rc, req, "MPI_Irecv")?;
                }
                TxOp::Send { buf, peer, tag } => {
                    let (p, t, n) = (
                        self.check_peer(*peer, "send")?,
                        self.check_tag(*tag)?,
                        to_int(buf.len(), "send")?,
                    );
                    // SAFETY: as above; `buf` is alive until Waitall returns.
                    let rc = unsafe {
                        ffi::MPI_Isend(send_ptr(buf), n, dtype, p, t, self.data, &mut req)
                    };
                    post(rc, req, "MPI_Isend")?;
                }
                _ => unreachable!("collectives ran above"),
            }
        }
        let n = to_int(requests.len(), "transaction")?;
        // SAFETY: every request was returned by MPI_Isend / MPI_Irecv and the
        // buffers they use are alive.
        check(
            unsafe { ffi::MPI_Waitall(n, requests.as_mut_ptr(), ffi::RSMPI_STATUSES_IGNORE) },
            "MPI_Waitall",
        )
    }
}
