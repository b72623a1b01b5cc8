//! The device fusion buffer: many small tensors packed into one persistent
//! buffer on the communication stream (no host round trip), reduced by one
//! collective, and unpacked the same way. Horovod's fused allreduce, on the
//! GPU. Several tensors move with one launch of the batched copy kernel
//! ([`crate::kernels::copy_ptx`]), one tensor with one `cuMemcpyDtoDAsync`.
//!
//! The parts are any device buffers: cudarc's per-buffer events cost two
//! or three driver calls per tensor (waits for its last uses, a record of
//! this one) when the tensors were allocated with event tracking on;
//! tensors allocated with it off, or passed as [`crate::Untracked`] (the
//! caller orders its streams, e.g. with one [`NcclComm::wait_event`] for
//! all of them), cost none.

use crate::error::NcclError;
use crate::kernels::copy_ptx::Segment;
use crate::safe::comm::NcclComm;
use crate::safe::ops::DeviceElement;
use crate::safe::work::Work;
use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use kolo_protocol::ReduceOp;
use kolo_transport::Scale;
use parking_lot::Mutex;

/// The packed element count of parts of `lens` elements (an overflowing
/// sum is an error).
fn packed_len(lens: impl Iterator<Item = usize>) -> Result<usize, NcclError> {
    let mut total = 0usize;
    for len in lens {
        total = total.checked_add(len).ok_or_else(|| {
            NcclError::InvalidArgument("fused tensor lengths overflow usize".into())
        })?;
    }
    Ok(total)
}

/// `total` elements of `elem` bytes, in bytes.
fn packed_bytes(total: usize, elem: usize) -> Result<usize, NcclError> {
    total.checked_mul(elem).ok_or_else(|| {
        NcclError::InvalidArgument(format!(
            "{total} fused elements of {elem} bytes overflow usize"
        ))
    })
}

/// A persistent device buffer of one communicator for fused operations.
pub struct DeviceFusionBuffer {
    buf: CudaSlice<u8>,
    scratch: Mutex<Scratch>,
}

/// Lists reused from call to call: fresh ones for 1,000 tensors per pack
/// and unpack cost page faults on a virtual machine.
#[derive(Default)]
struct Scratch {
    /// The copies of the last pack / unpack.
    segments: Vec<Segment>,
    /// Always empty between calls; its allocation holds the next call's
    /// cudarc guards.
    guards: Vec<SyncOnDrop<'static>>,
}

/// `store`'s allocation as an empty guard list of a shorter lifetime.
fn borrow_guards<'a>(store: &mut Vec<SyncOnDrop<'static>>) -> Vec<SyncOnDrop<'a>> {
    let mut guards = std::mem::take(store);
    guards.clear();
    // Collecting in place keeps the allocation (same element layout).
    guards.into_iter().collect()
}

/// Drops the guards (recording cudarc's events after the enqueued copies)
/// and gives the allocation back to `store`.
fn return_guards(mut guards: Vec<SyncOnDrop<'_>>, store: &mut Vec<SyncOnDrop<'static>>) {
    guards.clear();
    // `filter_map` (not `filter`) changes the element lifetime back to
    // 'static; the list is empty, so nothing is converted.
    #[allow(clippy::unnecessary_filter_map)]
    let empty = guards.into_iter().filter_map(|_| None).collect();
    *store = empty;
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
        Ok(DeviceFusionBuffer {
            buf,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// The buffer's bytes: the packed tensors first, one after another.
    pub fn bytes(&self) -> CudaView<'_, u8> {
        self.buf.slice(..)
    }

    /// Grows the buffer to at least `bytes` (the old one is freed in
    /// stream order, after the work using it).
    pub fn reserve(&mut self, comm: &NcclComm, bytes: usize) -> Result<(), NcclError> {
        if bytes > self.buf.len() {
            self.buf = DeviceFusionBuffer::new(comm, bytes.next_power_of_two())?.buf;
        }
        Ok(())
    }

    /// Copies `parts` one after another into the buffer (growing it when
    /// needed) and returns the packed element count.
    pub fn pack<T: DeviceElement, V: DevicePtr<T>>(
        &mut self,
        comm: &NcclComm,
        parts: &[V],
    ) -> Result<usize, NcclError> {
        let elem = std::mem::size_of::<T>();
        let total = packed_len(parts.iter().map(DeviceSlice::len))?;
        self.reserve(comm, packed_bytes(total, elem)?)?;
        comm.check_health()?;
        comm.device().bind()?;
        let stream = comm.stream();
        let (base, _written) = self.buf.device_ptr_mut(stream);
        let scratch = self.scratch.get_mut();
        let mut guards = borrow_guards(&mut scratch.guards);
        let segments = &mut scratch.segments;
        segments.clear();
        let mut offset = 0;
        for part in parts {
            comm.check_device(part, "fused tensor")?;
            let (src, guard) = part.device_ptr(stream);
            guards.push(guard);
            let bytes = part.len() * elem;
            segments.push(Segment {
                src,
                dst: base + offset as u64,
                bytes: bytes as u64,
            });
            offset += bytes;
        }
        // SAFETY: each source spans its part's bytes, each destination a
        // range of the same length inside the buffer (consecutive and
        // disjoint, within the `total` reserved above); all stay alive
        // until the stream reaches the copies (cudarc's events, recorded
        // when the guards drop after the enqueue).
        let copied = unsafe { comm.copy_segments(segments) };
        return_guards(guards, &mut scratch.guards);
        copied?;
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
    pub fn unpack<T: DeviceElement, V: DevicePtrMut<T>>(
        &self,
        comm: &NcclComm,
        parts: &mut [V],
    ) -> Result<(), NcclError> {
        let elem = std::mem::size_of::<T>();
        let total = packed_len(parts.iter().map(DeviceSlice::len))?;
        if packed_bytes(total, elem)? > self.buf.len() {
            return Err(NcclError::InvalidArgument(format!(
                "unpacking {total} elements of {} from a fusion buffer of {} bytes",
                T::DTYPE,
                self.buf.len()
            )));
        }
        comm.check_health()?;
        comm.device().bind()?;
        let stream = comm.stream();
        let (base, _read) = self.buf.device_ptr(stream);
        let mut scratch = self.scratch.lock();
        let scratch = &mut *scratch;
        let mut guards = borrow_guards(&mut scratch.guards);
        let segments = &mut scratch.segments;
        segments.clear();
        let mut offset = 0;
        for part in parts.iter_mut() {
            comm.check_device(part, "fused tensor")?;
            let bytes = part.len() * elem;
            let (dst, guard) = part.device_ptr_mut(stream);
            guards.push(guard);
            segments.push(Segment {
                src: base + offset as u64,
                dst,
                bytes: bytes as u64,
            });
            offset += bytes;
        }
        // SAFETY: as in `pack`, with the roles swapped: the destinations are
        // distinct mutable views (never overlapping), the sources disjoint
        // ranges of the buffer within its length (checked above).
        let copied = unsafe { comm.copy_segments(segments) };
        return_guards(guards, &mut scratch.guards);
        copied?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_can_move_between_threads_and_be_shared() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<DeviceFusionBuffer>();
    }

    #[test]
    fn guard_lists_keep_their_allocation() {
        let mut store: Vec<SyncOnDrop<'static>> = Vec::with_capacity(64);
        let capacity = store.capacity();
        let guards = borrow_guards(&mut store);
        assert!(guards.is_empty() && guards.capacity() >= capacity);
        return_guards(guards, &mut store);
        assert!(store.is_empty() && store.capacity() >= capacity);
        assert_eq!(packed_len([3usize, 4].into_iter()), Ok(7));
        assert!(packed_len([usize::MAX, 1].into_iter()).is_err());
        assert!(packed_bytes(usize::MAX, 2).is_err());
    }
}
