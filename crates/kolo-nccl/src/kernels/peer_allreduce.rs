//! The peer allreduce kernels on a device: [`crate::kernels::allreduce_ptx`]'s
//! module loaded into the device's context on first use
//! (`cuModuleLoadDataEx`, JIT-compiled by the driver) and launched with
//! `cuLaunchKernel` on a stream, over the registered buffers of
//! [`crate::safe::peer_buffers`].

use crate::error::NcclError;
use crate::kernels::allreduce_ptx::{
    chunk, data_offset, launch_dims, module_source, Algorithm, AllreduceKernel, ArDtype, MAX_RANKS,
};
use crate::kernels::module::PtxModule;
use cudarc::driver::sys::{CUdeviceptr, CUfunction, CUstream};
use cudarc::driver::CudaContext;
use kolo_protocol::DataType;
use std::ffi::c_void;
use std::sync::Arc;

/// One launch's arguments (see the kernels' module doc).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerLaunch {
    /// One-shot or two-shot.
    pub(crate) algorithm: Algorithm,
    /// f32, f16 or bf16.
    pub(crate) dtype: DataType,
    /// Where the result goes (may equal `input`).
    pub(crate) out: CUdeviceptr,
    /// This rank's contribution.
    pub(crate) input: CUdeviceptr,
    /// Every rank's registered buffer as this device addresses it.
    pub(crate) peers: [CUdeviceptr; MAX_RANKS],
    /// This rank.
    pub(crate) rank: usize,
    /// The number of ranks (2 to [`MAX_RANKS`]).
    pub(crate) world: usize,
    /// Elements.
    pub(crate) n: usize,
    /// This call's number (1, 2, ...), the same on every rank.
    pub(crate) epoch: u64,
    /// The registered buffers' data capacity in bytes.
    pub(crate) capacity: usize,
    /// Applied after the sum unless exactly 1 (`Scale::postscale_for`).
    pub(crate) factor: f64,
    /// How long a CTA waits for a peer's flag before it traps.
    pub(crate) timeout: std::time::Duration,
}

impl PeerLaunch {
    /// Checks what the kernels rely on; a violation is an error naming it.
    pub(crate) fn validate(&self) -> Result<AllreduceKernel, NcclError> {
        let dtype = ArDtype::for_dtype(self.dtype).ok_or_else(|| NcclError::Unsupported {
            op: "peer allreduce".into(),
            dtype: self.dtype,
            reason: "the peer kernels handle f32, f16 and bf16".into(),
        })?;
        if !(2..=MAX_RANKS).contains(&self.world) || self.rank >= self.world {
            return Err(NcclError::InvalidArgument(format!(
                "peer allreduce of rank {} among {} ranks: the kernels serve 2 to {MAX_RANKS}",
                self.rank, self.world
            )));
        }
        let bytes = self.n.checked_mul(self.dtype.size());
        if bytes.is_none_or(|b| b > self.capacity) {
            return Err(NcclError::InvalidArgument(format!(
                "peer allreduce of {} {} exceeds the registered {} bytes",
                self.n, self.dtype, self.capacity
            )));
        }
        if self.epoch == 0 || self.peers[..self.world].contains(&0) {
            return Err(NcclError::InvalidArgument(
                "peer allreduce without an epoch or a peer buffer".into(),
            ));
        }
        Ok(AllreduceKernel {
            algorithm: self.algorithm,
            dtype,
        })
    }
}

/// The loaded module and its functions.
pub(crate) struct PeerAllreduceModule {
    module: PtxModule,
    functions: Vec<(AllreduceKernel, CUfunction)>,
}

// SAFETY: function handles are plain driver handles of `module`'s context,
// valid in any thread that makes it current (`launch` binds it); launching
// one function from several threads is allowed.
unsafe impl Send for PeerAllreduceModule {}
// SAFETY: as above: `&self` only reads the handles.
unsafe impl Sync for PeerAllreduceModule {}

impl PeerAllreduceModule {
    /// JIT-compiles the module into `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<PeerAllreduceModule, NcclError> {
        let module = PtxModule::load(ctx, module_source(), "peer allreduce kernels'")?;
        let functions = AllreduceKernel::all()
            .into_iter()
            .map(|kernel| Ok((kernel, module.function(kernel.name())?)))
            .collect::<Result<Vec<_>, NcclError>>()?;
        Ok(PeerAllreduceModule { module, functions })
    }

    /// Enqueues one rank's part of an allreduce on `stream`. Nothing for
    /// zero elements.
    ///
    /// # Safety
    /// `args.input` and `args.out` span `n` elements of `dtype` in memory
    /// this module's context reaches (equal or not overlapping); every
    /// `args.peers[..world]` is a live registered buffer of
    /// [`crate::kernels::allreduce_ptx::registered_bytes`]`(capacity)`
    /// bytes reachable from this context, zero-initialised at
    /// registration, and `peers[rank]` is this rank's; every rank launches
    /// the same `(algorithm, dtype, n, world, epoch)` with epochs counting
    /// 1, 2, ... per registration; all alive until `stream` (of this
    /// context) reaches the launch.
    pub(crate) unsafe fn launch(
        &self,
        args: &PeerLaunch,
        stream: CUstream,
    ) -> Result<(), NcclError> {
        let kernel = args.validate()?;
        if args.n == 0 {
            return Ok(());
        }
        self.module.bind()?;
        let function = self
            .functions
            .iter()
            .find(|(k, _)| *k == kernel)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                NcclError::InvalidArgument(format!("kernel {} was not loaded", kernel.name()))
            })?;
        let mut out = args.out;
        let mut input = args.input;
        let mut peers = args.peers;
        let mut scalars: [u64; 6] = [
            args.rank as u64,
            args.world as u64,
            args.n as u64,
            chunk(args.n, args.world, kernel.dtype) as u64,
            args.epoch,
            data_offset(args.epoch, args.capacity),
        ];
        let mut factor = args.factor;
        let mut timeout_ns = u64::try_from(args.timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut params: Vec<*mut c_void> = Vec::with_capacity(2 + MAX_RANKS + 8);
        params.push((&mut out as *mut CUdeviceptr).cast());
        params.push((&mut input as *mut CUdeviceptr).cast());
        for p in peers.iter_mut() {
            params.push((p as *mut CUdeviceptr).cast());
        }
        for s in scalars.iter_mut() {
            params.push((s as *mut u64).cast());
        }
        params.push((&mut factor as *mut f64).cast());
        params.push((&mut timeout_ns as *mut u64).cast());
        let (blocks, threads) = launch_dims(args.algorithm, args.n, args.world, kernel.dtype);
        // SAFETY: `function` takes 16 u64, one f64 and one u64, the values
        // `params` points to in order (read by the driver during the call); the
        // kernel touches `n` elements of `input` and `out` and the
        // registered buffers' flags and data regions (the contract).
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
