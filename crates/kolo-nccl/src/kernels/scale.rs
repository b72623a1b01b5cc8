//! The scale kernels on a device: [`crate::kernels::scale_ptx`]'s module loaded into
//! the device's context on first use (`cuModuleLoadDataEx`, JIT-compiled
//! by the driver), launched with `cuLaunchKernel` on the communication
//! stream. Used by the reductions to apply what NCCL cannot (see
//! [`crate::reduce_plan`]). bool needs no kernel: a zero factor is a
//! memset, any other factor leaves the values as they are.

use crate::error::NcclError;
use crate::kernels::module::PtxModule;
use crate::kernels::scale_ptx::{launch_dims, module_source, ScaleKernel};
use crate::reduce_plan::ReducePlan;
use crate::safe::comm::NcclComm;
use cudarc::driver::sys::{CUdeviceptr, CUfunction, CUstream};
use cudarc::driver::{CudaContext, CudaSlice, DevicePtrMut};
use kolo_protocol::DataType;
use std::ffi::c_void;
use std::sync::Arc;

/// The loaded module and its functions, in [`ScaleKernel::ALL`] order.
pub(crate) struct ScaleModule {
    module: PtxModule,
    functions: Vec<(ScaleKernel, CUfunction)>,
}

// SAFETY: function handles are plain driver handles of `module`'s context,
// valid in any thread that makes it current (`launch` binds it); launching
// one function from several threads is allowed.
unsafe impl Send for ScaleModule {}
// SAFETY: as above: `&self` only reads the handles.
unsafe impl Sync for ScaleModule {}

impl ScaleModule {
    /// JIT-compiles the module into `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<ScaleModule, NcclError> {
        let module = PtxModule::load(ctx, module_source(), "scale kernels'")?;
        let functions = ScaleKernel::ALL
            .iter()
            .map(|&kernel| Ok((kernel, module.function(kernel.name())?)))
            .collect::<Result<Vec<_>, NcclError>>()?;
        Ok(ScaleModule { module, functions })
    }

    /// Enqueues `dst[i] = src[i] * factor` for `n` elements of `dtype` on
    /// `stream` (`dst == src` in place).
    ///
    /// # Safety
    /// `dst` and `src` each span `n` elements of `dtype` in device memory
    /// of this module's context (equal or not overlapping), alive until
    /// `stream` (of the same context) reaches the launch.
    pub(crate) unsafe fn launch(
        &self,
        dtype: DataType,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: usize,
        factor: f64,
        stream: CUstream,
    ) -> Result<(), NcclError> {
        if n == 0 {
            return Ok(());
        }
        self.module.bind()?;
        let kernel = ScaleKernel::for_dtype(dtype).ok_or_else(|| NcclError::Unsupported {
            op: "scale".into(),
            dtype,
            reason: "no device scale kernel for this type (bool is a memset)".into(),
        })?;
        let function = self
            .functions
            .iter()
            .find(|(k, _)| *k == kernel)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                NcclError::InvalidArgument(format!("kernel {} was not loaded", kernel.name()))
            })?;
        let (mut dst, mut src, mut n64, mut factor) = (dst, src, n as u64, factor);
        let mut params: [*mut c_void; 4] = [
            (&mut dst as *mut CUdeviceptr).cast(),
            (&mut src as *mut CUdeviceptr).cast(),
            (&mut n64 as *mut u64).cast(),
            (&mut factor as *mut f64).cast(),
        ];
        let (blocks, threads) = launch_dims(n);
        // SAFETY: `function` takes (u64, u64, u64, f64), the four values
        // `params` points to (read by the driver during the call); the
        // kernel touches `n` elements of each range (per the contract).
        unsafe {
            cudarc::driver::result::launch_kernel(
                function,
                (blocks, 1, 1),
                (threads, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(NcclError::on_cuda("cuLaunchKernel"))
    }
}

/// kolo's bool scale: a zero factor clears, any other copies.
///
/// # Safety
/// As [`ScaleModule::launch`], with `n` bytes.
unsafe fn bool_scale(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    factor: f64,
    stream: CUstream,
) -> Result<(), NcclError> {
    if factor == 0.0 {
        // SAFETY: `dst` spans `n` bytes (per the contract).
        unsafe { cudarc::driver::result::memset_d8_async(dst, 0, n, stream) }
            .map_err(NcclError::on_cuda("cuMemsetD8Async"))
    } else if dst != src {
        // SAFETY: both span `n` bytes and do not overlap (per the contract).
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, n, stream) }
            .map_err(NcclError::on_cuda("cuMemcpyDtoDAsync"))
    } else {
        Ok(())
    }
}

impl NcclComm {
    /// Loads the scale kernels when `plan` needs them, before anything is
    /// enqueued: a failure (a driver whose JIT cannot compile the module)
    /// is returned and leaves the communicator usable.
    pub(crate) fn prepare_kernels(&self, plan: &ReducePlan) -> Result<(), NcclError> {
        let needed = plan.prescale.is_some() || plan.postscale.is_some();
        if needed && plan.elem != DataType::Bool {
            self.device.bind()?;
            self.device.scale_kernels()?;
        }
        Ok(())
    }

    /// Enqueues `dst = factor * src` (`n` elements of `dtype`) on the
    /// communication stream, loading the kernels on first use.
    ///
    /// # Safety
    /// As [`ScaleModule::launch`], on this communicator's device.
    pub(crate) unsafe fn scale_on_stream(
        &self,
        dtype: DataType,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: usize,
        factor: f64,
    ) -> Result<(), NcclError> {
        let stream = self.stream().cu_stream();
        if dtype == DataType::Bool {
            if n == 0 {
                return Ok(());
            }
            self.device.bind()?;
            // SAFETY: forwarded contract (`n` bytes each).
            return unsafe { bool_scale(dst, src, n, factor, stream) };
        }
        let kernels = self.device.scale_kernels()?;
        // SAFETY: forwarded contract; the stream belongs to the device.
        unsafe { kernels.launch(dtype, dst, src, n, factor, stream) }
    }

    /// Uninitialised device memory of `bytes` (at least one) on the
    /// communication stream, freed in stream order when dropped, with its
    /// address. Callers write it before reading it.
    pub(crate) fn scratch(&self, bytes: usize) -> Result<(CudaSlice<u8>, CUdeviceptr), NcclError> {
        let stream = self.stream().clone();
        // SAFETY: the memory is uninitialised; every caller fills it (a
        // scale kernel writes all of it) before anything reads it.
        let mut buf = unsafe { stream.alloc::<u8>(bytes.max(1)) }
            .map_err(NcclError::on_cuda("cuMemAllocAsync"))?;
        let ptr = {
            let (ptr, _written) = buf.device_ptr_mut(&stream);
            ptr
        };
        Ok((buf, ptr))
    }
}
