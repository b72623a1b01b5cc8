//! One GPU as a communicator uses it: its primary context, its own
//! non-blocking stream at the highest priority the device offers, and a
//! pool of reusable events.

use crate::error::NcclError;
use crate::kernels::batched_copy::{CopyKernel, CopyTables};
use crate::kernels::scale::ScaleModule;
use crate::probe;
use crate::result::driver;
use crate::safe::completion::Fence;
use crate::safe::event_pool::{Pool, PoolStats};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};

/// Free events kept per device.
const MAX_IDLE_EVENTS: usize = 256;

/// A device, its communication stream and its event pool.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    events: Arc<Pool<CudaEvent>>,
    priority: i32,
    /// The scale kernels, loaded on first use (or why they could not be).
    scale: OnceLock<Result<ScaleModule, NcclError>>,
    /// The batched copy kernel, likewise.
    copy: OnceLock<Result<CopyKernel, NcclError>>,
    /// The batched copy kernel's table slots.
    tables: Mutex<CopyTables>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ordinal())
            .field("priority", &self.priority)
            .finish()
    }
}

impl Device {
    /// Opens device `ordinal`: probes the driver first (a missing libcuda
    /// is an error, not a panic), retains the primary context and creates
    /// a non-blocking stream at the greatest priority of
    /// `cuCtxGetStreamPriorityRange`.
    pub fn open(ordinal: usize) -> Result<Device, NcclError> {
        let (_, count) = probe::cuda()?;
        if ordinal >= count {
            return Err(NcclError::NoDevice {
                reason: format!("device {ordinal} was requested but {count} are visible"),
            });
        }
        probe::guard("open device", || {
            let ctx = CudaContext::new(ordinal)
                .map_err(NcclError::on_cuda("cuDevicePrimaryCtxRetain"))?;
            ctx.bind_to_thread()
                .map_err(NcclError::on_cuda("cuCtxSetCurrent"))?;
            // Numerically smaller is more urgent: `greatest` is the highest.
            let (_least, greatest) = cudarc::driver::result::stream::get_priority_range()
                .map_err(NcclError::on_cuda("cuCtxGetStreamPriorityRange"))?;
            let stream = ctx
                .new_stream_with_priority(greatest)
                .map_err(NcclError::on_cuda("cuStreamCreateWithPriority"))?;
            Ok(Device {
                ctx,
                stream,
                events: Arc::new(Pool::new(MAX_IDLE_EVENTS)),
                priority: greatest,
                scale: OnceLock::new(),
                copy: OnceLock::new(),
                tables: Mutex::new(CopyTables::default()),
            })
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's primary context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The communication stream (non-blocking, highest priority).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The stream's priority (lower is more urgent).
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// The scale kernels of this device, JIT-compiled into its context on
    /// the first call (a failure is remembered and returned every time).
    pub(crate) fn scale_kernels(&self) -> Result<&ScaleModule, NcclError> {
        self.scale
            .get_or_init(|| ScaleModule::load(&self.ctx))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The batched copy kernel of this device, JIT-compiled on the first
    /// call (a failure is remembered and returned every time).
    pub(crate) fn copy_kernel(&self) -> Result<&CopyKernel, NcclError> {
        self.copy
            .get_or_init(|| CopyKernel::load(&self.ctx))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The batched copy kernel's table slots.
    pub(crate) fn copy_tables(&self) -> &Mutex<CopyTables> {
        &self.tables
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<(), NcclError> {
        self.ctx
            .bind_to_thread()
            .map_err(NcclError::on_cuda("cuCtxSetCurrent"))
    }

    /// An event from the pool (created when none is free).
    pub(crate) fn pooled_event(&self) -> Result<PooledEvent, NcclError> {
        let event = self.events.take(|| {
            self.ctx
                .new_event(None)
                .map_err(NcclError::on_cuda("cuEventCreate"))
        })?;
        Ok(PooledEvent {
            event: Some(event),
            pool: self.events.clone(),
        })
    }

    /// A pooled event recorded now on the communication stream.
    pub(crate) fn record(&self) -> Result<PooledEvent, NcclError> {
        let event = self.pooled_event()?;
        event
            .get()
            .record(&self.stream)
            .map_err(NcclError::on_cuda("cuEventRecord"))?;
        Ok(event)
    }

    /// The communication stream waits, on the GPU, for `event`'s last
    /// record (`cuStreamWaitEvent`; the CPU does not block).
    pub fn wait_event(&self, event: &CudaEvent) -> Result<(), NcclError> {
        self.stream
            .wait(event)
            .map_err(NcclError::on_cuda("cuStreamWaitEvent"))
    }

    /// The communication stream waits, on the GPU, for everything enqueued
    /// on `other` so far.
    pub fn wait_stream(&self, other: &CudaStream) -> Result<(), NcclError> {
        if other.context().cu_ctx() == self.ctx.cu_ctx() {
            let event = self.pooled_event()?;
            event
                .get()
                .record(other)
                .map_err(NcclError::on_cuda("cuEventRecord"))?;
            // The wait captures the record made above; the event may be
            // re-recorded (reused) right after.
            return self.wait_event(event.get());
        }
        let event = other
            .record_event(None)
            .map_err(NcclError::on_cuda("cuEventRecord"))?;
        self.wait_event(&event)
    }

    /// `other` waits, on the GPU, for everything enqueued on the
    /// communication stream so far (LLMQ's `wait_on_comms`).
    pub fn join_into(&self, other: &CudaStream) -> Result<(), NcclError> {
        let event = self.record()?;
        other
            .wait(event.get())
            .map_err(NcclError::on_cuda("cuStreamWaitEvent"))
    }

    /// True when everything enqueued on the communication stream has run.
    pub fn idle(&self) -> Result<bool, NcclError> {
        self.bind()?;
        // SAFETY: the stream is owned by `self` and alive.
        unsafe { driver::stream_idle(self.stream.cu_stream()) }
    }

    /// Blocks until the communication stream is idle (unbounded; prefer
    /// [`crate::Work::wait_timeout`]).
    pub fn synchronize(&self) -> Result<(), NcclError> {
        self.stream
            .synchronize()
            .map_err(NcclError::on_cuda("cuStreamSynchronize"))
    }

    /// Surfaces errors cudarc recorded in the context instead of returning
    /// them (its event-tracking calls).
    pub(crate) fn check_recorded(&self) -> Result<(), NcclError> {
        self.ctx
            .check_err()
            .map_err(NcclError::on_cuda("cudarc event tracking"))
    }

    /// The event pool's counters.
    pub fn event_stats(&self) -> PoolStats {
        self.events.stats()
    }
}

/// An event borrowed from a device's pool; returned on drop.
pub(crate) struct PooledEvent {
    event: Option<CudaEvent>,
    pool: Arc<Pool<CudaEvent>>,
}

impl PooledEvent {
    pub(crate) fn get(&self) -> &CudaEvent {
        // Only `drop` takes the event out.
        self.event
            .as_ref()
            .unwrap_or_else(|| unreachable!("a pooled event is present until dropped"))
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            self.pool.put(event);
        }
    }
}

/// A recorded pooled event as the completion thread watches it.
pub(crate) struct EventFence {
    pub(crate) event: PooledEvent,
}

impl Fence for EventFence {
    fn poll(&mut self) -> Result<bool, NcclError> {
        self.event
            .get()
            .try_is_complete()
            .map_err(NcclError::on_cuda("cuEventQuery"))
    }
}
