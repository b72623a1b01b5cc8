//! The batched copy kernel on a device ([`crate::kernels::copy_ptx`]): loaded on
//! first use, launched once on the communication stream over a table the
//! kernel reads straight from mapped pinned host memory (no upload: on a
//! virtual machine each driver call that rings the GPU costs microseconds,
//! and a table is read once, 32 bytes per CTA).
//!
//! Tables live in a small ring of per-device slots (mapped pinned memory,
//! grown on demand): a slot is rewritten only after the event recorded
//! behind its last launch has completed, so the host never overwrites a
//! table a kernel has yet to read, and back-to-back packs and unpacks (one
//! step: pack, allreduce, unpack) never wait.

use crate::error::NcclError;
use crate::kernels::copy_ptx::{self, Segment, CHUNK_BYTES, ENTRY_BYTES, KERNEL};
use crate::kernels::module::PtxModule;
use crate::result::driver;
use crate::safe::comm::NcclComm;
use crate::safe::device::PooledEvent;
use cudarc::driver::sys::{CUdeviceptr, CUfunction, CUstream};
use cudarc::driver::{CudaContext, PinnedHostSlice};
use std::ffi::c_void;
use std::sync::Arc;

/// Table slots per device: pack and unpack of one step and the next step's
/// pack find a free slot while the GPU is a step behind.
const SLOTS: usize = 4;
/// The smallest table allocation (128 rows).
const MIN_TABLE_BYTES: usize = 4096;

/// The loaded kernel.
pub(crate) struct CopyKernel {
    module: PtxModule,
    function: CUfunction,
}

// SAFETY: the function handle is a plain driver handle of `module`'s
// context, valid in any thread that makes it current (`launch` binds it).
unsafe impl Send for CopyKernel {}
// SAFETY: as above: `&self` only reads the handles.
unsafe impl Sync for CopyKernel {}

impl CopyKernel {
    /// JIT-compiles the kernel into `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<CopyKernel, NcclError> {
        let module = PtxModule::load(ctx, copy_ptx::module_source(), "batched copy kernel's")?;
        let function = module.function(KERNEL)?;
        Ok(CopyKernel { module, function })
    }

    /// Enqueues the kernel over the `entries` rows at `table`.
    ///
    /// # Safety
    /// `table` holds `entries` rows (written before the launch, untouched
    /// until the kernel has run) whose ranges are live device memory of this context until
    /// `stream` reaches the launch, destinations not overlapping anything
    /// else the launch touches.
    unsafe fn launch(
        &self,
        table: CUdeviceptr,
        entries: usize,
        stream: CUstream,
    ) -> Result<(), NcclError> {
        self.module.bind()?;
        let (mut table, mut n) = (table, entries as u64);
        let mut params: [*mut c_void; 2] = [
            (&mut table as *mut CUdeviceptr).cast(),
            (&mut n as *mut u64).cast(),
        ];
        let (blocks, threads) = copy_ptx::launch_dims(entries);
        // SAFETY: the kernel takes (u64, u64), the two values `params`
        // points to (read during the call); the rows are valid per the
        // contract.
        unsafe {
            cudarc::driver::result::launch_kernel(
                self.function,
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

/// One table: mapped pinned host rows, their device address, and the
/// event after the last launch that read them.
struct Slot {
    /// Owns the pinned rows (`rows` points into them).
    host: PinnedHostSlice<u8>,
    rows: *mut u8,
    dev_ptr: CUdeviceptr,
    in_flight: Option<PooledEvent>,
}

impl Slot {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Slot, NcclError> {
        let bytes = bytes.max(MIN_TABLE_BYTES).next_power_of_two();
        // Cached (not write-combined) pinned memory, mapped into the
        // device's address space: the host writes rows with small stores,
        // the kernel reads each once.
        // SAFETY: uninitialised memory; `plan_into` writes every row the
        // kernel is told to read before the launch.
        let mut host = unsafe {
            ctx.alloc_pinned_with_flags::<u8>(bytes, cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .map_err(NcclError::on_cuda("cuMemHostAlloc"))?;
        let rows = host
            .as_mut_ptr()
            .map_err(NcclError::on_cuda("cuEventSynchronize"))?;
        // SAFETY: `rows` is the start of the mapped allocation above, made
        // in `ctx`, which `alloc_pinned_with_flags` left current.
        let dev_ptr = unsafe { driver::host_device_pointer(rows) }?;
        Ok(Slot {
            host,
            rows,
            dev_ptr,
            in_flight: None,
        })
    }

    /// Blocks until the last launch reading this slot has completed.
    fn settle(&mut self) -> Result<(), NcclError> {
        if let Some(event) = self.in_flight.take() {
            event
                .get()
                .synchronize()
                .map_err(NcclError::on_cuda("cuEventSynchronize"))?;
        }
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The pinned rows must outlive the kernel reading them.
        let _ = self.settle();
    }
}

// SAFETY: `rows` points into `host`, which the slot owns; the slot is
// only reached through the device's mutex.
unsafe impl Send for Slot {}

/// A batched copy planned once and launched again and again (the pack or
/// the unpack of a [`crate::PersistentAllreduce`]): its table has mapped
/// pinned memory of its own, written once and only read afterwards, so a
/// launch neither plans nor waits for a slot; dropping it waits for the
/// last launch to have read the table.
pub(crate) struct CopyPlan {
    slot: Slot,
    entries: usize,
}

/// The ring of table slots of one device.
#[derive(Default)]
pub(crate) struct CopyTables {
    slots: Vec<Option<Slot>>,
    next: usize,
}

impl NcclComm {
    /// Enqueues every copy of `segments` on the communication stream: none
    /// for no bytes, one `cuMemcpyDtoDAsync` for one segment, otherwise one
    /// launch of the batched copy kernel (loaded on first use) over a table
    /// in mapped pinned memory.
    ///
    /// # Safety
    /// Every segment's source and destination span `bytes` of live device
    /// memory of this communicator's device until the stream reaches the
    /// copy; no destination overlaps another segment's source or
    /// destination.
    pub(crate) unsafe fn copy_segments(&self, segments: &[Segment]) -> Result<(), NcclError> {
        let stream = self.stream();
        let mut live = segments.iter().filter(|s| s.bytes > 0);
        let (first, second) = (live.next(), live.next());
        let Some(first) = first else { return Ok(()) };
        self.device.bind()?;
        if second.is_none() {
            // SAFETY: per the contract.
            return unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    first.dst,
                    first.src,
                    first.bytes as usize,
                    stream.cu_stream(),
                )
            }
            .map_err(NcclError::on_cuda("cuMemcpyDtoDAsync"));
        }
        let bound = copy_ptx::max_entries(segments, CHUNK_BYTES) * ENTRY_BYTES;
        let kernel = self.device.copy_kernel()?;
        let mut tables = self.device.copy_tables().lock();
        let index = tables.next % SLOTS;
        tables.next = tables.next.wrapping_add(1);
        if tables.slots.len() < SLOTS {
            tables.slots.resize_with(SLOTS, || None);
        }
        let slot = &mut tables.slots[index];
        if slot.as_ref().is_none_or(|s| s.host.len() < bound) {
            *slot = None;
            *slot = Some(Slot::new(self.device.context(), bound)?);
        }
        let slot = slot
            .as_mut()
            .ok_or_else(|| NcclError::InvalidArgument("no copy table slot".into()))?;
        slot.settle()?;
        // SAFETY: `rows` spans the slot's `host.len()` pinned bytes, which
        // nothing else reads or writes now: the last kernel reading them
        // has completed (`settle`), and the slot is borrowed exclusively.
        let host = unsafe { std::slice::from_raw_parts_mut(slot.rows, slot.host.len()) };
        let entries = plan_table(segments, host)?;
        // SAFETY: the rows were written above and stay untouched until
        // `in_flight` (recorded below, after the launch) completes; the
        // ranges are valid per this function's contract.
        unsafe { kernel.launch(slot.dev_ptr, entries, stream.cu_stream()) }?;
        slot.in_flight = Some(self.device.record()?);
        Ok(())
    }

    /// Plans `segments` into a table of their own, for
    /// [`NcclComm::launch_copy`].
    pub(crate) fn plan_copy(&self, segments: &[Segment]) -> Result<CopyPlan, NcclError> {
        let bound = copy_ptx::max_entries(segments, CHUNK_BYTES) * ENTRY_BYTES;
        let slot = Slot::new(self.device.context(), bound)?;
        // SAFETY: `rows` spans the slot's `host.len()` pinned bytes, which
        // no kernel reads yet.
        let host = unsafe { std::slice::from_raw_parts_mut(slot.rows, slot.host.len()) };
        let entries = plan_table(segments, host)?;
        Ok(CopyPlan { slot, entries })
    }

    /// Enqueues `plan`'s copies on the communication stream: one launch
    /// of the batched copy kernel over its table (nothing for no bytes).
    ///
    /// # Safety
    /// As [`NcclComm::copy_segments`], for the segments `plan` was made
    /// of, at this launch.
    pub(crate) unsafe fn launch_copy(&self, plan: &mut CopyPlan) -> Result<(), NcclError> {
        if plan.entries == 0 {
            return Ok(());
        }
        self.device.bind()?;
        let kernel = self.device.copy_kernel()?;
        // SAFETY: the table was written by `plan_copy` and is never written
        // again; the ranges are valid per this function's contract.
        unsafe { kernel.launch(plan.slot.dev_ptr, plan.entries, self.stream().cu_stream()) }?;
        // The event of this launch replaces the last one's: the table
        // stays until the latest launch has read it (`Slot`'s drop).
        plan.slot.in_flight = Some(self.device.record()?);
        Ok(())
    }
}

/// Plans `segments` into the table `host`; its number of rows.
fn plan_table(segments: &[Segment], host: &mut [u8]) -> Result<usize, NcclError> {
    copy_ptx::plan_into(segments, CHUNK_BYTES, host).ok_or_else(|| {
        NcclError::InvalidArgument(format!(
            "a copy table of {} bytes is too short for {} segments",
            host.len(),
            segments.len()
        ))
    })
}
