//! The device fusion buffer: many small tensors packed into one persistent
//! buffer with device-to-device copies on the communication stream
//! (`cuMemcpyDtoDAsync`, no host round trip), reduced by one collective,
//! and unpacked the same way. Horovod's fused allreduce, on the GPU.

use crate::comm::NcclComm;
use crate::error::NcclError;
use crate::ops::DeviceElement;
use crate::plan;
use crate::work::Work;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use kolo_protocol::ReduceOp;
use kolo_transport::Scale;

/// A persistent device buffer of one communicator for fused operations.
pub struct DeviceFusionBuffer {
    buf: CudaSlice<u8>,
}

impl std::fmt::Debug for DeviceFusionBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceFusionBuffer")
            .field("capacity", &self.buf.len())
            .finish()
    }
}

impl DeviceFusionBuffer {
    /// A buffer of `bytes` on `comm`'s device (allocated on its stream).
    pub fn new(comm: &NcclComm, bytes: usize) -> Result<Self, NcclError> {
        let buf = comm
            .stream()
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(NcclError::on_cuda("cuMemAllocAsync"))?;
        Ok(DeviceFusionBuffer { buf })
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Grows the buffer to at least `bytes` (the old one is freed in
    /// stream order, after the work using it).
    pub fn reserve(&mut self, comm: &NcclComm, bytes: usize) -> Result<(), NcclError> {
        if bytes > self.buf.len() {
            *self = DeviceFusionBuffer::new(comm, bytes.next_power_of_two())?;
        }
        Ok(())
    }

    /// Copies `parts` one after another into the buffer (growing it when
    /// needed) and returns the packed element count.
    pub fn pack<T: DeviceElement>(
        &mut self,
        comm: &NcclComm,
        parts: &[CudaView<'_, T>],
    ) -> Result<usize, NcclError> {
        let lens: Vec<usize> = parts.iter().map(CudaView::len).collect();
        let (offsets, total) = plan::offsets(&lens)?;
        let elem = std::mem::size_of::<T>();
        self.reserve(comm, total * elem)?;
        comm.check_health()?;
        comm.device().bind()?;
        let stream = comm.stream();
        for (part, offset) in parts.iter().zip(offsets) {
            comm.check_device(part, "fused tensor")?;
            let mut dst = self
                .buf
                .slice_mut(offset * elem..(offset + part.len()) * elem);
            let (src, _read) = part.device_ptr(stream);
            let (dst, _written) = dst.device_ptr_mut(stream);
            // SAFETY: `src` spans the part's bytes and `dst` a range of the
            // same length inside the buffer (offsets from `plan::offsets`);
            // both stay alive until the stream reaches the copy (cudarc's
            // events, recorded when the guards drop).
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    dst,
                    src,
                    part.len() * elem,
                    stream.cu_stream(),
                )
            }
            .map_err(NcclError::on_cuda("cuMemcpyDtoDAsync"))?;
        }
        Ok(total)
    }

    /// One allreduce over the first `count` packed elements of `T`.
    pub fn all_reduce<T: DeviceElement>(
        &mut self,
        comm: &mut NcclComm,
        count: usize,
        op: ReduceOp,
        scale: Scale,
    ) -> Result<Work, NcclError> {
        comm.all_reduce_dyn(&mut self.buf, T::DTYPE, count, op, scale)
    }

    /// Copies the packed elements back into `parts` (the same lengths, in
    /// the same order, as packed).
    pub fn unpack<T: DeviceElement>(
        &self,
        comm: &NcclComm,
        parts: &mut [CudaViewMut<'_, T>],
    ) -> Result<(), NcclError> {
        let lens: Vec<usize> = parts.iter().map(CudaViewMut::len).collect();
        let (offsets, total) = plan::offsets(&lens)?;
        let elem = std::mem::size_of::<T>();
        if total * elem > self.buf.len() {
            return Err(NcclError::InvalidArgument(format!(
                "unpacking {total} elements of {} from a fusion buffer of {} bytes",
                T::DTYPE,
                self.buf.len()
            )));
        }
        comm.check_health()?;
        comm.device().bind()?;
        let stream = comm.stream();
        for (part, offset) in parts.iter_mut().zip(offsets) {
            comm.check_device(part, "fused tensor")?;
            let bytes = part.len() * elem;
            let src = self.buf.slice(offset * elem..offset * elem + bytes);
            let (src, _read) = src.device_ptr(stream);
            let (dst, _written) = part.device_ptr_mut(stream);
            // SAFETY: as in `pack`, with the roles swapped.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream())
            }
            .map_err(NcclError::on_cuda("cuMemcpyDtoDAsync"))?;
        }
        Ok(())
    }
}
