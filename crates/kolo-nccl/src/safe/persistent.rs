//! [`PersistentAllreduce`]: one fused allreduce of the same device
//! tensors, step after step, planned once — what MPI's persistent
//! collectives do for a call that repeats. A training step reduces the
//! same gradient buffers every time; their pack and unpack tables are
//! written once into pinned memory of their own, so a step costs three
//! launches (pack, allreduce, unpack) whatever the number of tensors,
//! instead of resolving and planning every tensor twice per step.

use crate::error::NcclError;
use crate::kernels::batched_copy::CopyPlan;
use crate::kernels::copy_ptx::Segment;
use crate::safe::comm::NcclComm;
use crate::safe::ops::DeviceElement;
use crate::safe::work::Work;
use cudarc::driver::{CudaSlice, DevicePtr};
use kolo_protocol::ReduceOp;
use kolo_transport::Scale;

/// A fused allreduce of fixed device tensors (address and length in
/// elements of `T`, on one communicator's device), with its own fusion
/// buffer and copy tables.
pub struct PersistentAllreduce<T> {
    tensors: Vec<(u64, usize)>,
    fused: CudaSlice<T>,
    len: usize,
    pack: CopyPlan,
    unpack: CopyPlan,
}

impl<T> std::fmt::Debug for PersistentAllreduce<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentAllreduce")
            .field("tensors", &self.tensors.len())
            .field("elements", &self.len)
            .finish()
    }
}

impl<T: DeviceElement> PersistentAllreduce<T> {
    /// Plans the fused allreduce of `tensors` (device address and length
    /// in elements, in the order of the fused buffer) on `comm`'s device:
    /// allocates the fusion buffer and writes both copy tables. Nothing is
    /// enqueued on the tensors; only [`PersistentAllreduce::run`] touches
    /// them.
    pub fn new(comm: &NcclComm, tensors: Vec<(u64, usize)>) -> Result<Self, NcclError> {
        let elem = std::mem::size_of::<T>();
        let len = tensors
            .iter()
            .try_fold(0usize, |sum, &(_, n)| sum.checked_add(n))
            .filter(|&n| n.checked_mul(elem).is_some())
            .ok_or_else(|| {
                NcclError::InvalidArgument(format!(
                    "a fused allreduce of {} tensors of {} overflows",
                    tensors.len(),
                    T::DTYPE
                ))
            })?;
        comm.check_health()?;
        comm.device().bind()?;
        // CUDA allocates no empty buffers.
        let fused = comm
            .stream()
            .alloc_zeros::<T>(len.max(1))
            .map_err(NcclError::on_cuda("cuMemAllocAsync"))?;
        // Only the address is kept: every later use of the buffer is on
        // this stream, in its order.
        let base = fused.device_ptr(comm.stream()).0;
        let mut offset = 0u64;
        let mut pack = Vec::with_capacity(tensors.len());
        let mut unpack = Vec::with_capacity(tensors.len());
        for &(ptr, n) in &tensors {
            let bytes = (n * elem) as u64;
            let at = base + offset;
            pack.push(Segment {
                src: ptr,
                dst: at,
                bytes,
            });
            unpack.push(Segment {
                src: at,
                dst: ptr,
                bytes,
            });
            offset += bytes;
        }
        Ok(PersistentAllreduce {
            pack: comm.plan_copy(&pack)?,
            unpack: comm.plan_copy(&unpack)?,
            tensors,
            fused,
            len,
        })
    }

    /// The tensors it reduces, as given to [`PersistentAllreduce::new`].
    pub fn tensors(&self) -> &[(u64, usize)] {
        &self.tensors
    }

    /// Enqueues one step on `comm`'s stream: the tensors packed into the
    /// fusion buffer, one allreduce of it with `op` and `scale`, the
    /// results unpacked into the tensors. The returned [`Work`] completes
    /// once the device is done.
    ///
    /// # Safety
    /// `comm` is the communicator the allreduce was planned on. Every
    /// tensor is live device memory of `T` of its length until the stream
    /// has run this step; the stream is ordered after every earlier use of
    /// the tensors and every later use after the returned work; the
    /// tensors do not overlap each other.
    pub unsafe fn run(
        &mut self,
        comm: &mut NcclComm,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<Work, NcclError> {
        // SAFETY: the pack reads the tensors (live per the contract) and
        // writes the fusion buffer, which this value owns on `comm`'s
        // stream; the unpack the other way round, after the allreduce.
        unsafe { comm.launch_copy(&mut self.pack) }?;
        let len = self.len;
        comm.all_reduce_dyn(&mut self.fused, T::DTYPE, len, op, scale)?;
        // SAFETY: as for the pack.
        unsafe { comm.launch_copy(&mut self.unpack) }?;
        comm.flush()
    }
}
