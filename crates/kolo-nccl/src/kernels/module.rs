//! A module of hand-written PTX JIT-compiled into one context by the
//! driver (`cuModuleLoadDataEx`, no nvrtc or nvcc), its functions looked up
//! by name, unloaded on drop. Shared by the scale kernels and the batched
//! copy kernel.

use crate::error::NcclError;
use crate::result::driver;
use cudarc::driver::sys::{CUfunction, CUmodule};
use cudarc::driver::CudaContext;
use std::ffi::CString;
use std::sync::Arc;

/// A loaded PTX module.
pub(crate) struct PtxModule {
    ctx: Arc<CudaContext>,
    module: CUmodule,
}

// SAFETY: module and function handles are plain driver handles, valid in
// any thread that makes their context current (`bind` and `drop` do);
// launching the same function from several threads is allowed.
unsafe impl Send for PtxModule {}
// SAFETY: as above: `&self` only reads the handles.
unsafe impl Sync for PtxModule {}

impl PtxModule {
    /// JIT-compiles `source` (`what` names it in errors) into `ctx`.
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        source: String,
        what: &str,
    ) -> Result<PtxModule, NcclError> {
        ctx.bind_to_thread()
            .map_err(NcclError::on_cuda("cuCtxSetCurrent"))?;
        let source = CString::new(source)
            .map_err(|_| NcclError::InvalidArgument(format!("the {what} PTX contains a NUL")))?;
        // SAFETY: `ctx` was made current above.
        let module = unsafe { driver::load_ptx(&source) }?;
        Ok(PtxModule {
            ctx: ctx.clone(),
            module,
        })
    }

    /// The function `name` of the module.
    pub(crate) fn function(&self, name: &str) -> Result<CUfunction, NcclError> {
        let c_name = CString::new(name)
            .map_err(|_| NcclError::InvalidArgument(format!("kernel name {name} has a NUL")))?;
        // SAFETY: `module` is loaded (and unloaded only by `drop`).
        unsafe { cudarc::driver::result::module::get_function(self.module, c_name) }
            .map_err(NcclError::on_cuda("cuModuleGetFunction"))
    }

    /// Makes the module's context current (before a launch).
    pub(crate) fn bind(&self) -> Result<(), NcclError> {
        self.ctx
            .bind_to_thread()
            .map_err(NcclError::on_cuda("cuCtxSetCurrent"))
    }
}

impl Drop for PtxModule {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded by `load`, unloaded once here; the handles are
            // not used after (launches already enqueued keep their code).
            let _ = unsafe { cudarc::driver::result::module::unload(self.module) };
        }
    }
}
