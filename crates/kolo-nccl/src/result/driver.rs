//! The CUDA driver calls kolo-nccl needs that cudarc's `result` layer does
//! not wrap, in that layer's style: one thin function per call, the status
//! code turned into a `Result` here. Everything else goes through cudarc.
//! The first three let [`crate::probe`] find out whether libcuda is usable
//! before anything touches cudarc's loader, which panics when it is not.

use crate::error::{driver_message, NcclError};
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUevent, CUresult, CUstream};

/// Whether libcuda loads under one of cudarc's candidate names.
pub fn library_present() -> bool {
    // SAFETY: only tries to dlopen libcuda under cudarc's candidate names
    // (running the driver library's initialisers, which set up its own
    // state only); the handles are closed again.
    unsafe { sys::is_culib_present() }
}

/// The first of `symbols` that libcuda lacks, if any.
///
/// # Safety
/// [`library_present`] returned true: cudarc's loader, used here, panics
/// when it finds no library.
pub unsafe fn first_missing_symbol<'a>(symbols: &[&'a str]) -> Option<&'a str> {
    // SAFETY: the library is present (the caller's contract), so cudarc's
    // loader finds it and does not panic.
    let library = unsafe { sys::culib() };
    symbols.iter().copied().find(|symbol| {
        // SAFETY: only looks the symbol up; the pointer is never called
        // through this (opaque, unit-typed) handle.
        unsafe { library.get::<*const ()>(*symbol) }.is_err()
    })
}

/// `cuDriverGetVersion`: e.g. 13000 for CUDA 13.0.
///
/// # Safety
/// [`library_present`] returned true and the symbol was found.
pub unsafe fn driver_version() -> Result<i32, NcclError> {
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer; the symbol exists per the
    // caller's contract.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(NcclError::on_cuda("cuDriverGetVersion"))?;
    Ok(version)
}

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

/// `cuMemHostGetDevicePointer`: the device address of mapped pinned host
/// memory (allocated with `CU_MEMHOSTALLOC_DEVICEMAP`), which kernels of
/// the current context may read directly.
///
/// # Safety
/// `host` points into live pinned memory mapped for the current context.
pub unsafe fn host_device_pointer(host: *mut u8) -> Result<sys::CUdeviceptr, NcclError> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer; `host` per the caller's
    // contract.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut ptr, host.cast(), 0) }
        .result()
        .map_err(NcclError::on_cuda("cuMemHostGetDevicePointer"))?;
    Ok(ptr)
}

/// `cuModuleLoadDataEx` of a PTX `image` into the current context; a JIT
/// failure carries the JIT's error log.
///
/// # Safety
/// A context is current on this thread.
pub unsafe fn load_ptx(image: &std::ffi::CStr) -> Result<sys::CUmodule, NcclError> {
    let mut log = vec![0u8; 8192];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    // The driver reads option values as pointer-sized words: the buffer's
    // address, then its size.
    let mut values = [
        log.as_mut_ptr().cast::<std::ffi::c_void>(),
        log.len() as *mut std::ffi::c_void,
    ];
    let mut module = std::mem::MaybeUninit::uninit();
    // SAFETY: `image` is NUL-terminated; the option arrays have 2 entries
    // and the log buffer outlives the call; per the caller's contract a
    // context is current.
    let status = unsafe {
        sys::cuModuleLoadDataEx(
            module.as_mut_ptr(),
            image.as_ptr().cast(),
            options.len() as std::ffi::c_uint,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    match status {
        // SAFETY: the driver wrote the module on success.
        CUresult::CUDA_SUCCESS => Ok(unsafe { module.assume_init() }),
        other => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let jit = String::from_utf8_lossy(&log[..end]).trim().to_string();
            let message = driver_message(cudarc::driver::DriverError(other));
            Err(NcclError::Cuda {
                call: "cuModuleLoadDataEx",
                message: if jit.is_empty() {
                    message
                } else {
                    format!("{message}; JIT log: {jit}")
                },
            })
        }
    }
}

/// `cuMemPoolSetAccess`: the devices of ordinals `peers` may read and
/// write every allocation, present and future, of `device`'s current and
/// default stream-ordered memory pools (where cudarc allocates). Without
/// it a copy engine of another GPU cannot reach them directly and the
/// driver stages peer copies through the host.
pub fn share_pools(device: CUdevice, peers: &[std::ffi::c_int]) -> Result<(), NcclError> {
    if peers.is_empty() {
        return Ok(());
    }
    let descs: Vec<sys::CUmemAccessDesc> = peers
        .iter()
        .map(|&ordinal| sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect();
    // SAFETY: `device` is a device handle of the driver.
    let current = unsafe { cudarc::driver::result::device::get_mem_pool(device) }
        .map_err(NcclError::on_cuda("cuDeviceGetMemPool"))?;
    // SAFETY: as above.
    let default = unsafe { cudarc::driver::result::device::get_default_mem_pool(device) }
        .map_err(NcclError::on_cuda("cuDeviceGetDefaultMemPool"))?;
    let pools = if current == default {
        vec![current]
    } else {
        vec![current, default]
    };
    for pool in pools {
        // SAFETY: `pool` is a live pool of `device`; `descs` holds
        // `descs.len()` valid descriptors of other devices.
        unsafe { sys::cuMemPoolSetAccess(pool, descs.as_ptr(), descs.len()) }
            .result()
            .map_err(NcclError::on_cuda("cuMemPoolSetAccess"))?;
    }
    Ok(())
}

/// The bytes of a CUDA IPC memory handle.
pub const IPC_HANDLE_BYTES: usize = 64;

/// `cuIpcGetMemHandle`: a handle another process opens to map `ptr`'s
/// allocation.
///
/// # Safety
/// `ptr` is the start of a live `cuMemAlloc` allocation of the current
/// context.
pub unsafe fn ipc_handle(ptr: sys::CUdeviceptr) -> Result<[u8; IPC_HANDLE_BYTES], NcclError> {
    let mut handle = sys::CUipcMemHandle_st {
        reserved: [0; IPC_HANDLE_BYTES],
    };
    // SAFETY: `handle` is a valid out-pointer; `ptr` per the contract.
    unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) }
        .result()
        .map_err(NcclError::on_cuda("cuIpcGetMemHandle"))?;
    Ok(handle.reserved.map(|b| b as u8))
}

/// `cuIpcOpenMemHandle` (with lazy peer access): maps another process's
/// allocation into the current context; closed by [`ipc_close`].
///
/// # Safety
/// A context is current; `handle` came from [`ipc_handle`] in another
/// process whose allocation is still alive.
pub unsafe fn ipc_open(handle: &[u8; IPC_HANDLE_BYTES]) -> Result<sys::CUdeviceptr, NcclError> {
    let handle = sys::CUipcMemHandle_st {
        reserved: handle.map(|b| b as std::ffi::c_char),
    };
    let mut ptr: sys::CUdeviceptr = 0;
    let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
    // SAFETY: `ptr` is a valid out-pointer; the handle per the contract.
    unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, lazy) }
        .result()
        .map_err(NcclError::on_cuda("cuIpcOpenMemHandle"))?;
    Ok(ptr)
}

/// `cuIpcCloseMemHandle`: unmaps what [`ipc_open`] mapped.
///
/// # Safety
/// `ptr` came from [`ipc_open`] in the current context, is closed once,
/// and no enqueued work uses it any more.
pub unsafe fn ipc_close(ptr: sys::CUdeviceptr) -> Result<(), NcclError> {
    // SAFETY: per the contract.
    unsafe { sys::cuIpcCloseMemHandle(ptr) }
        .result()
        .map_err(NcclError::on_cuda("cuIpcCloseMemHandle"))
}
