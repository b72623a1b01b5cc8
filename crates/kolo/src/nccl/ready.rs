//! Ready events from a process-wide pool: a submission records one on each
//! caller stream, the engine's stream waits for it, and it goes back to
//! the pool when the engine drops the tensors (long after the wait was
//! enqueued, which captured the record). Creating and destroying an event
//! per submission cost two driver calls more.

use cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
use cudarc::driver::{CudaEvent, CudaStream, DriverError};
use parking_lot::Mutex;

/// Free events kept, of every context.
const MAX_IDLE: usize = 64;

/// Free events; each knows its context.
static FREE: Mutex<Vec<CudaEvent>> = Mutex::new(Vec::new());

/// An event recorded on a caller's stream; returns to the pool on drop.
pub(crate) struct ReadyEvent {
    event: Option<CudaEvent>,
}

impl ReadyEvent {
    /// An event of `stream`'s context (from the pool, or new) recorded
    /// now on `stream`.
    pub(crate) fn record(stream: &CudaStream) -> Result<ReadyEvent, DriverError> {
        let ctx = stream.context();
        let pooled = {
            let mut free = FREE.lock();
            let mine = free
                .iter()
                .rposition(|e| e.context().cu_ctx() == ctx.cu_ctx());
            mine.map(|i| free.swap_remove(i))
        };
        let event = match pooled {
            Some(event) => event,
            None => ctx.new_event(Some(CU_EVENT_DISABLE_TIMING))?,
        };
        // A failed record drops the event (it goes back to the pool).
        let ready = ReadyEvent { event: Some(event) };
        ready.get().record(stream)?;
        Ok(ready)
    }

    /// The event.
    pub(crate) fn get(&self) -> &CudaEvent {
        // Only `drop` takes the event out.
        self.event
            .as_ref()
            .unwrap_or_else(|| unreachable!("a ready event is present until dropped"))
    }
}

impl Drop for ReadyEvent {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            let mut free = FREE.lock();
            if free.len() < MAX_IDLE {
                free.push(event);
            }
        }
    }
}
