//! The control plane over MPI: small byte messages on the private control
//! communicator (counts first, then payloads).

use crate::comm::MpiComm;
use crate::raw::{check, counts_displs, recv_ptr, send_ptr, to_int};
use kolo_transport::{BitOp, Controller, Result, Topology, TransportError};
use mpi::ffi;
use std::os::raw::{c_int, c_void};

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
        let mine = len as u64;
        let mut all = vec![0u64; self.size()];
        // SAFETY: one u64 sent, `size` u64s received into `all`.
        check(
            unsafe {
                ffi::MPI_Allgather(
                    &mine as *const u64 as *const c_void,
                    1,
                    ffi::RSMPI_UINT64_T,
                    recv_ptr(&mut all),
                    1,
                    ffi::RSMPI_UINT64_T,
                    self.control,
                )
            },
            "MPI_Allgather(lengths)",
        )?;
        Ok(all.into_iter().map(|n| n as usize).collect())
    }
}

impl Controller for MpiComm {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        let root_c = self.check_root(root, "gather_bytes")?;
        let mine = msg.len() as u64;
        let is_root = self.rank() == root;
        let mut lens = vec![0u64; if is_root { self.size() } else { 0 }];
        // SAFETY: one u64 from each rank into `lens` (size entries on root).
        check(
            unsafe {
                ffi::MPI_Gather(
                    &mine as *const u64 as *const c_void,
                    1,
                    ffi::RSMPI_UINT64_T,
                    recv_ptr(&mut lens),
                    1,
                    ffi::RSMPI_UINT64_T,
                    root_c,
                    self.control,
                )
            },
            "MPI_Gather(lengths)",
        )?;
        let lens: Vec<usize> = lens.into_iter().map(|n| n as usize).collect();
        let (counts, displs) = counts_displs(&lens, "gather_bytes")?;
        let total: usize = lens.iter().sum();
        let mut all = vec![0u8; total];
        let send_count = to_int(msg.len(), "gather_bytes")?;
        // SAFETY: each rank sends its `msg`; the root receives `counts[r]`
        // bytes at `displs[r]` inside `all` (sized to their sum).
        check(
            unsafe {
                ffi::MPI_Gatherv(
                    send_ptr(msg),
                    send_count,
                    ffi::RSMPI_UINT8_T,
                    recv_ptr(&mut all),
                    counts.as_ptr(),
                    displs.as_ptr(),
                    ffi::RSMPI_UINT8_T,
                    root_c,
                    self.control,
                )
            },
            "MPI_Gatherv(messages)",
        )?;
        if !is_root {
            return Ok(None);
        }
        Ok(Some(split(&all, &lens)))
    }

    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        let root_c = self.check_root(root, "broadcast_bytes")?;
        let mut len = msg.len() as u64;
        // SAFETY: one u64 broadcast in place.
        check(
            unsafe {
                ffi::MPI_Bcast(
                    &mut len as *mut u64 as *mut c_void,
                    1,
                    ffi::RSMPI_UINT64_T,
                    root_c,
                    self.control,
                )
            },
            "MPI_Bcast(length)",
        )?;
        let len = usize::try_from(len).map_err(|_| {
            TransportError::Backend(format!("broadcast length {len} does not fit in memory"))
        })?;
        let mut buf = if self.rank() == root {
            msg.to_vec()
        } else {
            vec![0u8; len]
        };
        let count = to_int(len, "broadcast_bytes")?;
        // SAFETY: `buf` holds `len` bytes on every rank.
        check(
            unsafe {
                ffi::MPI_Bcast(
                    recv_ptr(&mut buf),
                    count,
                    ffi::RSMPI_UINT8_T,
                    root_c,
                    self.control,
                )
            },
            "MPI_Bcast(message)",
        )?;
        Ok(buf)
    }

    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        let lens = self.allgather_lens(msg.len())?;
        let (counts, displs) = counts_displs(&lens, "allgather_bytes")?;
        let mut all = vec![0u8; lens.iter().sum()];
        let send_count = to_int(msg.len(), "allgather_bytes")?;
        // SAFETY: every rank receives `counts[r]` bytes at `displs[r]` of `all`.
        check(
            unsafe {
                ffi::MPI_Allgatherv(
                    send_ptr(msg),
                    send_count,
                    ffi::RSMPI_UINT8_T,
                    recv_ptr(&mut all),
                    counts.as_ptr(),
                    displs.as_ptr(),
                    ffi::RSMPI_UINT8_T,
                    self.control,
                )
            },
            "MPI_Allgatherv(messages)",
        )?;
        Ok(split(&all, &lens))
    }

    fn control_barrier(&mut self) -> Result<()> {
        // SAFETY: a barrier on our control communicator.
        check(
            unsafe { ffi::MPI_Barrier(self.control) },
            "MPI_Barrier(control)",
        )
    }

    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        let count = to_int(words.len(), "bitwise_allreduce")?;
        // SAFETY: in-place reduction of `count` u64 words in `words`.
        check(
            unsafe {
                let mpi_op = match op {
                    BitOp::And => ffi::RSMPI_BAND,
                    BitOp::Or => ffi::RSMPI_BOR,
                };
                ffi::MPI_Allreduce(
                    self.in_place,
                    recv_ptr(words),
                    count,
                    ffi::RSMPI_UINT64_T,
                    mpi_op,
                    self.control,
                )
            },
            "MPI_Allreduce(bits)",
        )
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
