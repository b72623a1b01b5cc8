//! Buffers of the device data plane: allocation, upload and download of
//! [`CudaBuffer`]s, and the fused buffer's pack / unpack over views (the
//! batched copy kernel of [`crate::DeviceFusionBuffer`]).

use crate::error::NcclError;
use crate::kernels::copy_ptx::Segment;
use crate::safe::access::Accesses;
use crate::safe::comm::NcclComm;
use crate::safe::memory::CudaBuffer;
use crate::safe::views::{CudaMut, CudaRef};
use crate::span::fused_offsets;
use cudarc::driver::CudaSlice;
use kolo_transport::{byte_view, with_element_type, Element};
use std::any::Any;

/// `value` as the type `B` it is when `A` and `B` are the same type; an
/// error naming `T` and its dtype otherwise (an [`Element`] that is not
/// the Rust type kolo uses for its dtype).
fn same_type<A: 'static, B: 'static, T: Element>(value: A) -> Result<B, NcclError> {
    let boxed: Box<dyn Any> = Box::new(value);
    boxed
        .downcast::<B>()
        .map(|b| *b)
        .map_err(|_| NcclError::Unsupported {
            op: "a device buffer".into(),
            dtype: T::DTYPE,
            reason: format!(
                "{} is not the Rust type kolo uses for {}",
                std::any::type_name::<T>(),
                T::DTYPE
            ),
        })
}

impl NcclComm {
    /// `len` zeroed elements of `T` on the communication stream.
    pub(crate) fn alloc_buffer<T: Element>(&self, len: usize) -> Result<CudaBuffer<T>, NcclError> {
        self.check_health()?;
        let stream = self.stream();
        // cudarc allocates only what it can zero (`DeviceRepr`), which
        // every kolo dtype's Rust type is: allocate that type and hand it
        // over as `T`, which it is.
        let slice: CudaSlice<T> = with_element_type!(T::DTYPE, U => {
            let slice = stream
                .alloc_zeros::<U>(len.max(1))
                .map_err(NcclError::on_cuda("cuMemAllocAsync"))?;
            same_type::<CudaSlice<U>, CudaSlice<T>, T>(slice)?
        });
        Ok(CudaBuffer::with_len(slice, len))
    }

    /// A new buffer holding `data`.
    pub(crate) fn upload<T: Element>(&mut self, data: &[T]) -> Result<CudaBuffer<T>, NcclError> {
        let mut buf = self.alloc_buffer::<T>(data.len())?;
        if data.is_empty() {
            return Ok(buf);
        }
        {
            let view = buf.view_mut();
            let mut access = Accesses::new(self)?;
            let mut raw = access.write(&view, "uploaded buffer")?.bytes();
            self.stream()
                .memcpy_htod(byte_view::as_bytes(data), &mut raw)
                .map_err(NcclError::on_cuda("cuMemcpyHtoDAsync"))?;
        }
        self.device.check_recorded()?;
        Ok(buf)
    }

    /// `buf`'s elements once everything enqueued before has run (bounded
    /// by the operation timeout: a peer that never joins a collective
    /// fails the wait instead of blocking the copy).
    pub(crate) fn download<T: Element>(
        &mut self,
        buf: CudaRef<'_, T>,
    ) -> kolo_transport::Result<Vec<T>> {
        self.flush()?.wait()?;
        let mut out = vec![T::default(); buf.len()];
        if buf.is_empty() {
            return Ok(out);
        }
        let mut bytes = vec![0u8; std::mem::size_of_val(out.as_slice())];
        {
            let mut access = Accesses::new(self)?;
            let raw = access.read(buf, "downloaded buffer")?.bytes();
            self.stream()
                .memcpy_dtoh(&raw, bytes.as_mut_slice())
                .map_err(NcclError::on_cuda("cuMemcpyDtoHAsync"))?;
        }
        self.device.check_recorded()?;
        byte_view::copy_from_bytes(&mut out, &bytes)?;
        Ok(out)
    }

    /// Copies `srcs` one after another into `dst` (exactly their total
    /// length).
    pub(crate) fn pack_views<T: Element>(
        &mut self,
        srcs: &[CudaRef<'_, T>],
        dst: CudaMut<'_, T>,
    ) -> Result<(), NcclError> {
        let offsets = fused_offsets("pack", T::DTYPE, srcs.iter().map(CudaRef::len), dst.len())?;
        let elem = std::mem::size_of::<T>();
        let mut access = Accesses::new(self)?;
        let to = access.write(&dst, "fused buffer")?.ptr();
        let mut segments = Vec::with_capacity(srcs.len());
        for (src, offset) in srcs.iter().zip(offsets) {
            let from = access.read(*src, "fused tensor")?;
            segments.push(Segment {
                src: from.ptr(),
                dst: to + (offset * elem) as u64,
                bytes: (src.len() * elem) as u64,
            });
        }
        let what = format!("pack of {} {} tensors", srcs.len(), T::DTYPE);
        self.run(what, |comm| {
            // SAFETY: every source spans its view's bytes, every
            // destination as many bytes of `dst` (consecutive, disjoint,
            // within its length: `fused_offsets` checked the total), all on
            // this device (checked by `Accesses`) and borrowed until the
            // copies are enqueued, their uses recorded after (`access`).
            // Sources cannot overlap `dst`: safe views of one buffer are
            // either one writable view or shared ones.
            unsafe { comm.copy_segments(&segments) }
        })?;
        Ok(())
    }

    /// Copies consecutive pieces of `src` (exactly their total length)
    /// into `dsts`.
    pub(crate) fn unpack_views<T: Element>(
        &mut self,
        src: CudaRef<'_, T>,
        dsts: &mut [CudaMut<'_, T>],
    ) -> Result<(), NcclError> {
        let offsets = fused_offsets("unpack", T::DTYPE, dsts.iter().map(CudaMut::len), src.len())?;
        let elem = std::mem::size_of::<T>();
        let mut access = Accesses::new(self)?;
        let from = access.read(src, "fused buffer")?.ptr();
        let mut segments = Vec::with_capacity(dsts.len());
        for (dst, offset) in dsts.iter().zip(offsets) {
            let to = access.write(dst, "fused tensor")?;
            segments.push(Segment {
                src: from + (offset * elem) as u64,
                dst: to.ptr(),
                bytes: (dst.len() * elem) as u64,
            });
        }
        let what = format!("unpack of {} {} tensors", dsts.len(), T::DTYPE);
        self.run(what, |comm| {
            // SAFETY: as in `pack_views`, roles swapped: the destinations
            // are distinct writable views (disjoint pieces even when they
            // share a buffer), the sources consecutive ranges of `src`.
            unsafe { comm.copy_segments(&segments) }
        })?;
        Ok(())
    }
}
