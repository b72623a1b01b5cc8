//! The control plane over MPI: small byte messages on the private control
//! communicator (counts first, then payloads).

use crate::comm::MpiComm;
use crate::raw::datatype::{predefined_op, uint64, uint8, PredefinedOp};
use crate::raw::{collective, counts_displs};
use kolo_transport::{BitOp, Controller, Result, Topology, TransportError};
use std::os::raw::c_int;

impl MpiComm {
    fn check_root(&self, root: usize, what: &str) -> Result<c_int> {
        if root >= self.size() {
            return Err(TransportError::InvalidArgument(format!(
                "{what}: root {root} out of range for {} ranks",
                self.size()
            )));
        }
        Ok(root as c_int)
    }

    /// Every rank's `len`, on every rank.
    fn allgather_lens(&mut self, len: usize) -> Result<Vec<usize>> {
        let mut all = vec![0u64; self.size()];
        // SAFETY: the control communicator is live while `self` is; one u64
        // from each rank into `all`, `size` long.
        unsafe { collective::allgather(&[len as u64], &mut all, uint64(), self.control.handle()) }
            .map_err(during("allgather_bytes (lengths)"))?;
        Ok(all.into_iter().map(|n| n as usize).collect())
    }
}

/// Names the control-plane step an MPI error happened in.
fn during(step: &'static str) -> impl FnOnce(TransportError) -> TransportError {
    move |e| match e {
        TransportError::Backend(why) => TransportError::Backend(format!("{step}: {why}")),
        other => other,
    }
}

impl Controller for MpiComm {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        let root_c = self.check_root(root, "gather_bytes")?;
        let comm = self.control.handle();
        let is_root = self.rank() == root;
        let mut lens = vec![0u64; if is_root { self.size() } else { 0 }];
        // SAFETY: the control communicator is live while `self` is; one u64
        // from each rank into `lens`, `size` long on the root.
        unsafe { collective::gather(&[msg.len() as u64], &mut lens, uint64(), root_c, comm) }
            .map_err(during("gather_bytes (lengths)"))?;
        let lens: Vec<usize> = lens.into_iter().map(|n| n as usize).collect();
        let (counts, displs) = counts_displs(&lens, "gather_bytes")?;
        let mut all = vec![0u8; lens.iter().sum()];
        // SAFETY: as above; the root receives `counts[r]` bytes at
        // `displs[r]` of `all`, sized to their sum (the lengths gathered).
        unsafe { collective::gatherv(msg, &mut all, &counts, &displs, uint8(), root_c, comm) }
            .map_err(during("gather_bytes (messages)"))?;
        if !is_root {
            return Ok(None);
        }
        Ok(Some(split(&all, &lens)))
    }

    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        let root_c = self.check_root(root, "broadcast_bytes")?;
        let comm = self.control.handle();
        let mut len = [msg.len() as u64];
        // SAFETY: the control communicator is live while `self` is; one u64
        // on every rank.
        unsafe { collective::bcast(&mut len, uint64(), root_c, comm) }
            .map_err(during("broadcast_bytes (length)"))?;
        let len = usize::try_from(len[0]).map_err(|_| {
            TransportError::Backend(format!(
                "broadcast length {} does not fit in memory",
                len[0]
            ))
        })?;
        let mut buf = if self.rank() == root {
            msg.to_vec()
        } else {
            vec![0u8; len]
        };
        // SAFETY: as above; `buf` holds the root's length on every rank.
        unsafe { collective::bcast(&mut buf, uint8(), root_c, comm) }
            .map_err(during("broadcast_bytes (message)"))?;
        Ok(buf)
    }

    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        let lens = self.allgather_lens(msg.len())?;
        let (counts, displs) = counts_displs(&lens, "allgather_bytes")?;
        let mut all = vec![0u8; lens.iter().sum()];
        // SAFETY: the control communicator is live while `self` is; every
        // rank receives `counts[r]` bytes at `displs[r]` of `all`, sized to
        // their sum (the lengths gathered).
        unsafe {
            collective::allgatherv(
                msg,
                &mut all,
                &counts,
                &displs,
                uint8(),
                self.control.handle(),
            )
        }
        .map_err(during("allgather_bytes (messages)"))
        .map(|()| split(&all, &lens))
    }

    fn control_barrier(&mut self) -> Result<()> {
        // SAFETY: the control communicator is live while `self` is.
        unsafe { collective::barrier(self.control.handle()) }.map_err(during("control_barrier"))
    }

    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        let op = predefined_op(match op {
            BitOp::And => PredefinedOp::BitwiseAnd,
            BitOp::Or => PredefinedOp::BitwiseOr,
        });
        // SAFETY: the control communicator is live while `self` is; an
        // in-place reduction of u64 words.
        unsafe { collective::allreduce_in_place(words, uint64(), op, self.control.handle()) }
            .map_err(during("bitwise_allreduce"))
    }
}

fn split(all: &[u8], lens: &[usize]) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(lens.len());
    let mut offset = 0;
    for &n in lens {
        out.push(all[offset..offset + n].to_vec());
        offset += n;
    }
    out
}
