//! Point-to-point operations of [`NcclComm`] on device memory: `ncclSend`
//! / `ncclRecv`, alone or grouped. NCCL matches the sends and receives of a
//! pair of ranks in issue order; there are no tags.

use crate::error::NcclError;
use crate::safe::comm::NcclComm;
use crate::safe::raw_comm::{grouped, RawComm};
use crate::safe::work::Work;
use cudarc::driver::{sys::CUdeviceptr, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use kolo_transport::{Element, Topology};

/// Which end of a point-to-point transfer this rank is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Send,
    Recv,
}

/// `ncclSend` / `ncclRecv` of `bytes` bytes at `ptr` with `peer` (nothing
/// when empty).
///
/// # Safety
/// `ptr` spans `bytes` bytes of the communicator's device, alive until the
/// stream reaches the call; `peer` is a rank of `raw`; `stream` is its
/// communication stream.
unsafe fn transfer(
    end: End,
    ptr: CUdeviceptr,
    bytes: usize,
    peer: usize,
    raw: &RawComm,
    stream: &CudaStream,
) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    unsafe {
        match end {
            End::Send => raw.send(ptr, bytes, peer, stream),
            End::Recv => raw.recv(ptr, bytes, peer, stream),
        }
    }
}

impl NcclComm {
    /// Sends `buf` to `peer` (`ncclSend`). NCCL matches sends and receives
    /// between two ranks in issue order; there are no tags.
    pub fn send<T: Element>(
        &mut self,
        buf: &impl DevicePtr<T>,
        peer: usize,
    ) -> Result<Work, NcclError> {
        self.check_device(buf, "send buffer")?;
        self.check_p2p_peer(peer, "send")?;
        let what = format!("send of {} {} to rank {peer}", buf.len(), T::DTYPE);
        self.run_single(what, buf.num_bytes(), |stream, raw| {
            let (ptr, _read) = buf.device_ptr(stream);
            // SAFETY: `ptr` spans the buffer, alive until the stream reaches
            // the call (cudarc's events); peer checked.
            unsafe { transfer(End::Send, ptr, buf.num_bytes(), peer, raw, stream) }
        })
    }

    /// Receives `buf.len()` elements from `peer` (`ncclRecv`).
    pub fn recv<T: Element>(
        &mut self,
        buf: &mut impl DevicePtrMut<T>,
        peer: usize,
    ) -> Result<Work, NcclError> {
        self.check_device(buf, "recv buffer")?;
        self.check_p2p_peer(peer, "recv")?;
        let (what, bytes) = (
            format!("recv of {} {} from rank {peer}", buf.len(), T::DTYPE),
            buf.num_bytes(),
        );
        self.run_single(what, bytes, |stream, raw| {
            let (ptr, _written) = buf.device_ptr_mut(stream);
            // SAFETY: as in `send`.
            unsafe { transfer(End::Recv, ptr, bytes, peer, raw, stream) }
        })
    }

    /// Sends `send` to `dst` and receives `recv` from `src` in one group:
    /// no deadlock when every rank does the same (ring exchanges).
    pub fn send_recv<T: Element>(
        &mut self,
        send: &impl DevicePtr<T>,
        dst: usize,
        recv: &mut impl DevicePtrMut<T>,
        src: usize,
    ) -> Result<Work, NcclError> {
        self.check_device(send, "send buffer")?;
        self.check_device(recv, "recv buffer")?;
        self.check_peer(dst, "send_recv destination")?;
        self.check_peer(src, "send_recv source")?;
        let (send_bytes, recv_bytes) = (send.num_bytes(), recv.num_bytes());
        self.run(
            format!("send_recv of {} {}", send.len(), T::DTYPE),
            |comm| {
                let stream = comm.device.stream().clone();
                let raw = comm.raw()?;
                let (s, _read) = send.device_ptr(&stream);
                let (r, _written) = recv.device_ptr_mut(&stream);
                // SAFETY: both buffers hold the byte counts given, alive
                // until the stream reaches the group (cudarc's events);
                // peers checked.
                grouped(|| unsafe {
                    transfer(End::Send, s, send_bytes, dst, &raw, &stream)?;
                    transfer(End::Recv, r, recv_bytes, src, &raw, &stream)
                })
            },
        )
    }

    /// Many sends and receives (buffer, peer) in one NCCL group, always
    /// through NCCL (also with copy engines on): a point-to-point exchange
    /// among any subset of ranks, matched per pair in order.
    pub fn send_recv_many<T: Element>(
        &mut self,
        sends: &[(&CudaSlice<T>, usize)],
        recvs: &mut [(&mut CudaSlice<T>, usize)],
    ) -> Result<Work, NcclError> {
        let what = format!(
            "group of {} sends and {} receives of {}",
            sends.len(),
            recvs.len(),
            T::DTYPE
        );
        let sends: Vec<(&dyn DevicePtr<T>, usize)> = sends
            .iter()
            .map(|(buf, peer)| (*buf as &dyn DevicePtr<T>, *peer))
            .collect();
        let mut recvs: Vec<(&mut dyn DevicePtrMut<T>, usize)> = recvs
            .iter_mut()
            .map(|(buf, peer)| (&mut **buf as &mut dyn DevicePtrMut<T>, *peer))
            .collect();
        self.send_recv_group(what, &sends, &mut recvs)
    }

    /// [`Self::send_recv_many`] over any device buffers, tracked as `what`.
    pub(crate) fn send_recv_group<T>(
        &mut self,
        what: String,
        sends: &[(&dyn DevicePtr<T>, usize)],
        recvs: &mut [(&mut dyn DevicePtrMut<T>, usize)],
    ) -> Result<Work, NcclError> {
        for (buf, peer) in sends {
            self.check_device(*buf, "send buffer")?;
            self.check_peer(*peer, "send")?;
        }
        for (buf, peer) in recvs.iter() {
            self.check_device(*buf, "recv buffer")?;
            self.check_peer(*peer, "recv")?;
        }
        self.run(what, |comm| {
            let stream = comm.device.stream().clone();
            let raw = comm.raw()?;
            let mut guards = Vec::new();
            let mut issued = Vec::new();
            for (buf, peer) in sends {
                let (ptr, guard) = buf.device_ptr(&stream);
                guards.push(guard);
                issued.push((End::Send, ptr, buf.num_bytes(), *peer));
            }
            for (buf, peer) in recvs.iter_mut() {
                let bytes = buf.num_bytes();
                let (ptr, guard) = buf.device_ptr_mut(&stream);
                guards.push(guard);
                issued.push((End::Recv, ptr, bytes, *peer));
            }
            grouped(|| {
                for &(end, ptr, bytes, peer) in &issued {
                    // SAFETY: `ptr` spans the buffer's `bytes`, alive until
                    // the stream reaches the group (cudarc's events,
                    // recorded when `guards` drop); peer checked.
                    unsafe { transfer(end, ptr, bytes, peer, &raw, &stream) }?;
                }
                Ok(())
            })
        })
    }

    fn check_p2p_peer(&self, peer: usize, what: &str) -> Result<(), NcclError> {
        self.check_peer(peer, what)?;
        if peer == self.rank() {
            return Err(NcclError::InvalidArgument(format!(
                "{what} to itself (rank {peer}) outside a group would deadlock; use send_recv or a transaction"
            )));
        }
        Ok(())
    }
}
