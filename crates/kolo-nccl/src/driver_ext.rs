//! The CUDA driver calls kolo-nccl needs that cudarc's `result` layer does
//! not wrap, in that layer's style: one thin function per call, the status
//! code turned into a `Result` here. Everything else goes through cudarc.

use crate::error::NcclError;
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUevent, CUresult, CUstream};

/// `cuDeviceCanAccessPeer`: can `device` read and write `peer`'s memory
/// directly (NVLink or PCIe peer-to-peer)?
pub fn can_access_peer(device: CUdevice, peer: CUdevice) -> Result<bool, NcclError> {
    let mut can: std::ffi::c_int = 0;
    // SAFETY: `can` is a valid out-pointer; device handles are plain ints
    // the driver validates.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, peer) }
        .result()
        .map_err(NcclError::on_cuda("cuDeviceCanAccessPeer"))?;
    Ok(can != 0)
}

/// `cuCtxEnablePeerAccess` from the current context to `peer`; already
/// enabled counts as success.
///
/// # Safety
/// `peer` is a live context; the context that should gain access is
/// current on this thread.
pub unsafe fn enable_peer_access(peer: CUcontext) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    match unsafe { sys::cuCtxEnablePeerAccess(peer, 0) } {
        CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        other => Err(NcclError::cuda(
            "cuCtxEnablePeerAccess",
            cudarc::driver::DriverError(other),
        )),
    }
}

/// `cuStreamQuery`: has everything enqueued on `stream` completed?
///
/// # Safety
/// `stream` is a live stream.
pub unsafe fn stream_idle(stream: CUstream) -> Result<bool, NcclError> {
    // SAFETY: per the caller's contract.
    match unsafe { sys::cuStreamQuery(stream) } {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => Err(NcclError::cuda(
            "cuStreamQuery",
            cudarc::driver::DriverError(other),
        )),
    }
}

/// `cuStreamWaitEvent`: `stream` waits on the GPU for `event`'s last
/// record (which may belong to another context or device).
///
/// # Safety
/// `stream` and `event` are live.
pub unsafe fn stream_wait(stream: CUstream, event: CUevent) -> Result<(), NcclError> {
    // SAFETY: per the caller's contract.
    unsafe {
        cudarc::driver::result::stream::wait_event(
            stream,
            event,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .map_err(NcclError::on_cuda("cuStreamWaitEvent"))
}

/// `cuMemcpyPeerAsync` (or `cuMemcpyDtoDAsync` within one context):
/// copies `bytes` from `src` in `src_ctx` to `dst` in `dst_ctx` on
/// `stream`, on the copy engines.
///
/// # Safety
/// Both ranges are live device memory of their contexts, `bytes` long, and
/// stay alive until `stream` reaches the copy; `stream` is live.
pub unsafe fn copy(
    dst_ctx: CUcontext,
    dst: sys::CUdeviceptr,
    src_ctx: CUcontext,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<(), NcclError> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: per the caller's contract.
    unsafe {
        if dst_ctx == src_ctx {
            cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream)
                .map_err(NcclError::on_cuda("cuMemcpyDtoDAsync"))
        } else {
            cudarc::driver::result::memcpy_peer_async(dst_ctx, dst, src_ctx, src, bytes, stream)
                .map_err(NcclError::on_cuda("cuMemcpyPeerAsync"))
        }
    }
}
