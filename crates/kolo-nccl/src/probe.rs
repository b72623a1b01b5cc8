//! Is there CUDA and NCCL here? Answered without panicking.
//!
//! cudarc's dynamic loader panics when libcuda (or one of its symbols) is
//! missing. Before kolo-nccl touches cudarc it asks [`cuda`], which checks
//! for the library with cudarc's own non-panicking probe, then resolves
//! every driver symbol kolo-nccl (and the cudarc calls it makes) uses, and
//! only then initialises the driver. [`nccl`] does the same for libnccl
//! (loaded by kolo-nccl itself, under the names its front page lists).

use crate::error::NcclError;
use crate::result::{self, driver};
use std::sync::OnceLock;

/// The driver functions kolo-nccl calls, directly or through cudarc.
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuCtxGetStreamPriorityRange",
    "cuCtxEnablePeerAccess",
    "cuStreamCreate",
    "cuStreamCreateWithPriority",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuEventElapsedTime",
    "cuMemAlloc_v2",
    "cuMemAllocAsync",
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemsetD8Async",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuDeviceGetMemPool",
    "cuDeviceGetDefaultMemPool",
    "cuMemPoolSetAccess",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemsetD8_v2",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// What this machine offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub driver_version: i32,
    /// Number of CUDA devices visible to this process.
    pub devices: usize,
    /// NCCL's version, e.g. 22803 for 2.28.3.
    pub nccl_version: i32,
    /// Where libnccl was loaded from.
    pub nccl_library: String,
}

/// Checks libcuda and its symbols, initialises the driver, and returns
/// `(driver version, device count)`. Zero devices is
/// [`NcclError::NoDevice`]. The answer is computed once per process.
pub fn cuda() -> Result<(i32, usize), NcclError> {
    static CUDA: OnceLock<Result<(i32, usize), NcclError>> = OnceLock::new();
    CUDA.get_or_init(probe_cuda).clone()
}

fn probe_cuda() -> Result<(i32, usize), NcclError> {
    if !driver::library_present() {
        return Err(NcclError::LibraryMissing {
            library: "libcuda",
            hint: format!(
                "no NVIDIA driver library (libcuda.so.1 or {} other names cudarc tries) on the loader path; \
                 install the NVIDIA driver or add its folder to LD_LIBRARY_PATH",
                cudarc::get_lib_name_candidates("cuda").len().saturating_sub(1)
            ),
        });
    }
    // SAFETY: the library is present (checked just above).
    if let Some(symbol) = unsafe { driver::first_missing_symbol(DRIVER_SYMBOLS) } {
        return Err(NcclError::SymbolMissing {
            library: "libcuda".into(),
            symbol: symbol.to_string(),
        });
    }
    guard("cuInit", || {
        cudarc::driver::result::init().map_err(NcclError::on_cuda("cuInit"))
    })?;
    // SAFETY: the library is present and has every symbol of
    // DRIVER_SYMBOLS, cuDriverGetVersion among them.
    let version = unsafe { driver::driver_version() }?;
    let count = cudarc::driver::result::device::get_count()
        .map_err(NcclError::on_cuda("cuDeviceGetCount"))?;
    if count <= 0 {
        return Err(NcclError::NoDevice {
            reason: "the driver reports no CUDA device (check CUDA_VISIBLE_DEVICES)".into(),
        });
    }
    Ok((version, count as usize))
}

/// Loads libnccl and returns its version.
pub fn nccl() -> Result<i32, NcclError> {
    result::nccl::version()
}

/// Both probes: CUDA first, then NCCL.
pub fn platform() -> Result<Platform, NcclError> {
    let (driver_version, devices) = cuda()?;
    let nccl_version = nccl()?;
    Ok(Platform {
        driver_version,
        devices,
        nccl_version,
        nccl_library: result::nccl::library_path()?,
    })
}

/// Runs `f`, turning a panic inside cudarc (a driver symbol that
/// [`DRIVER_SYMBOLS`] missed) into an error of `call` instead of unwinding
/// through the caller.
pub(crate) fn guard<T>(
    call: &'static str,
    f: impl FnOnce() -> Result<T, NcclError>,
) -> Result<T, NcclError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "cudarc panicked".into());
        Err(NcclError::Cuda { call, message })
    })
}

/// Formats an NCCL version code (`22803`) as `2.28.3`.
pub fn version_string(code: i32) -> String {
    // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
    format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_nccl_versions() {
        assert_eq!(version_string(22803), "2.28.3");
        assert_eq!(version_string(21805), "2.18.5");
    }

    #[test]
    fn guard_turns_panics_into_errors() {
        let r: Result<(), NcclError> = guard("cuFake", || panic!("Missing symbol cuFake"));
        assert!(
            matches!(r, Err(NcclError::Cuda { call: "cuFake", message }) if message.contains("cuFake"))
        );
        assert_eq!(guard("cuFine", || Ok(3)), Ok(3));
    }

    #[test]
    fn probes_report_instead_of_panicking() {
        // On a machine without CUDA both are errors; with CUDA both succeed.
        // Either way the call returns.
        match platform() {
            Ok(p) => assert!(p.devices > 0 && p.nccl_version > 0),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}
