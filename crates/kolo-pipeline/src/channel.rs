//! [`Channel`]: one end of a one-way channel as a helper thread uses it —
//! host bytes on every kolo backend (any [`Collectives`] is a channel),
//! and, where the backend can (NCCL, feature `nccl`), device tensors moved
//! GPU to GPU.
//!
//! kolo's data-plane trait carries host slices, so device memory needs a
//! trait of the pipeline's own: its device methods default to "not here",
//! and [`crate::nccl::NcclChannel`] (not a `Collectives`, so the blanket
//! implementation leaves it alone) overrides them with kolo-nccl's
//! `ncclSend` / `ncclRecv` on the device buffer.

use kolo_transport::{Collectives, Result};

/// One end of a one-way pipeline channel: host bytes, and device tensors
/// where [`Channel::moves_device`] says so.
///
/// Every `Collectives + Send + 'static` is a channel of host bytes (its
/// tagged `send` / `recv` of `u8`s). A backend that moves device memory
/// implements the trait itself, overriding the device methods.
pub trait Channel: Send + 'static {
    /// Sends `bytes` to `peer` (the other end's rank in this channel's
    /// communicator) with `tag`.
    fn send_bytes(&mut self, bytes: &[u8], peer: usize, tag: u32) -> Result<()>;

    /// Receives exactly `bytes.len()` bytes from `peer` with `tag`.
    fn recv_bytes(&mut self, bytes: &mut [u8], peer: usize, tag: u32) -> Result<()>;

    /// True when device tensors move on this channel (GPU to GPU); false
    /// by default.
    fn moves_device(&self) -> bool {
        false
    }

    /// Sends a device tensor's elements to `peer` from device memory (its
    /// header went ahead as host bytes). The default refuses:
    /// [`crate::Pipeline`] checks [`Channel::moves_device`] before it
    /// gets here.
    #[cfg(feature = "nccl")]
    fn send_device(&mut self, tensor: &crate::DeviceTensor, peer: usize) -> Result<()> {
        let _ = (tensor, peer);
        Err(host_only())
    }

    /// Receives a device tensor of `dtype` and `shape` from `peer` into a
    /// buffer allocated on this end's GPU. The default refuses.
    #[cfg(feature = "nccl")]
    fn recv_device(
        &mut self,
        dtype: kolo_protocol::DataType,
        shape: Vec<usize>,
        peer: usize,
    ) -> Result<crate::DeviceTensor> {
        let _ = (dtype, shape, peer);
        Err(host_only())
    }
}

#[cfg(feature = "nccl")]
fn host_only() -> kolo_transport::TransportError {
    kolo_transport::TransportError::InvalidArgument(
        "this channel moves host memory only (device tensors need an NCCL channel)".into(),
    )
}

impl<B: Collectives + Send + 'static> Channel for B {
    fn send_bytes(&mut self, bytes: &[u8], peer: usize, tag: u32) -> Result<()> {
        self.send(bytes, peer, tag)
    }

    fn recv_bytes(&mut self, bytes: &mut [u8], peer: usize, tag: u32) -> Result<()> {
        self.recv(bytes, peer, tag)
    }
}
