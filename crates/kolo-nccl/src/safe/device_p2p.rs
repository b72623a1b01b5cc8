//! Point-to-point messages of the device data plane (`Collectives<Cuda>`):
//! sends staged on the device and issued with this rank's next receive
//! (see `outbox.rs` for why every staged send goes with it).

use crate::error::NcclError;
use crate::safe::access::Accesses;
use crate::safe::comm::NcclComm;
use crate::safe::views::{CudaMut, CudaRef};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use kolo_transport::Element;

impl NcclComm {
    /// Copies `buf` into a new staging buffer (on the stream) and stages
    /// it for `peer`; nothing for an empty message.
    pub(crate) fn stage_send<T: Element>(
        &mut self,
        buf: CudaRef<'_, T>,
        peer: usize,
    ) -> Result<(), NcclError> {
        self.check_peer(peer, "send")?;
        let bytes = std::mem::size_of::<T>() * buf.len();
        if bytes == 0 {
            return self.check_health();
        }
        let (staged, to) = self.scratch(bytes)?;
        {
            let mut access = Accesses::new(self)?;
            let from = access.read(buf, "send buffer")?;
            let what = format!(
                "staging a send of {} {} to rank {peer}",
                buf.len(),
                T::DTYPE
            );
            self.run(what, |comm| {
                // SAFETY: `from` spans `bytes` of this device (resolved by
                // `access`, which records the read after this enqueue), `to`
                // the staging allocation of `bytes`, alive until the stream
                // has run the copy (freed in stream order when dropped).
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        to,
                        from.ptr(),
                        bytes,
                        comm.stream().cu_stream(),
                    )
                }
                .map_err(NcclError::on_cuda("cuMemcpyDtoDAsync"))
            })?;
        }
        self.staged.push(peer, staged);
        Ok(())
    }

    /// One NCCL group of every staged send, `send` (to its peer) and
    /// `recv` (from its peer); empty messages are left out on both ends.
    /// A bad peer or device leaves the staged sends staged.
    pub(crate) fn exchange<T: Element>(
        &mut self,
        send: Option<(CudaRef<'_, T>, usize)>,
        recv: Option<(CudaMut<'_, T>, usize)>,
    ) -> Result<(), NcclError> {
        if let Some((_, dst)) = &send {
            self.check_peer(*dst, "send")?;
        }
        if let Some((_, src)) = &recv {
            self.check_peer(*src, "recv")?;
        }
        let what = describe::<T>(self.staged.len(), &send, &recv);
        let mut access = Accesses::new(self)?;
        let out = match send.filter(|(buf, _)| !buf.is_empty()) {
            Some((buf, dst)) => Some((access.read(buf, "send buffer")?.bytes(), dst)),
            None => None,
        };
        let mut into = match recv.as_ref().filter(|(buf, _)| !buf.is_empty()) {
            Some((buf, src)) => Some((access.write(buf, "recv buffer")?.bytes(), *src)),
            None => None,
        };
        let staged = self.staged.take_all();
        if staged.is_empty() && out.is_none() && into.is_none() {
            return Ok(());
        }
        let mut sends: Vec<(&dyn DevicePtr<u8>, usize)> = staged
            .iter()
            .map(|(peer, buf)| (buf as &dyn DevicePtr<u8>, *peer))
            .collect();
        if let Some((raw, dst)) = &out {
            sends.push((raw, *dst));
        }
        let mut recvs: Vec<(&mut dyn DevicePtrMut<u8>, usize)> = Vec::new();
        if let Some((raw, src)) = &mut into {
            recvs.push((raw, *src));
        }
        self.send_recv_group(what, &sends, &mut recvs)?;
        Ok(())
    }
}

/// What an exchange is, for its error messages.
fn describe<T: Element>(
    staged: usize,
    send: &Option<(CudaRef<'_, T>, usize)>,
    recv: &Option<(CudaMut<'_, T>, usize)>,
) -> String {
    let mut parts = Vec::new();
    if let Some((buf, dst)) = send {
        parts.push(format!("send of {} {} to rank {dst}", buf.len(), T::DTYPE));
    }
    if let Some((buf, src)) = recv {
        parts.push(format!(
            "recv of {} {} from rank {src}",
            buf.len(),
            T::DTYPE
        ));
    }
    if staged > 0 {
        parts.push(format!("{staged} staged sends"));
    }
    parts.join(" with ")
}
