//! The completion thread's watchdog on a real GPU: an allreduce that never
//! completes fails its handle with a timeout naming it, the watchdog
//! aborts the communicator right then (not at teardown), later calls are
//! refused saying so, and the teardown ends within its bound.
//!
//! What holds the operation back is a wait on the communication stream for
//! a device word that only the test sets (`cuStreamWaitValue32`): one GPU
//! cannot make NCCL itself wait for a missing peer (NCCL refuses two ranks
//! on one device), and a stream wait is released afterwards, so the GPU is
//! left as it was found.

use super::{err, Report};
use cudarc::driver::sys::{self, CUstreamWaitValue_flags};
use cudarc::driver::{CudaContext, DevicePtr};
use kolo_nccl::{NcclComm, NcclOptions, Teardown};
use kolo_protocol::ReduceOp;
use kolo_transport::{Controller, Scale};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The operation timeout of this check's communicator.
const TIMEOUT: Duration = Duration::from_millis(500);
/// Its teardown bound.
const TEARDOWN: Duration = Duration::from_secs(10);

/// Every rank of `ctrl` runs it (collective: it makes a communicator).
pub fn run<C: Controller + ?Sized>(ctrl: &mut C, ordinal: usize, report: &mut Report) {
    let options = NcclOptions {
        op_timeout: TIMEOUT,
        teardown_timeout: TEARDOWN,
        device: Some(ordinal),
        ..NcclOptions::default()
    };
    let comm = match NcclComm::init(ctrl, options) {
        Ok(comm) => comm,
        Err(e) => return report.check("watchdog: init", Err(err(e))),
    };
    let outcome = held_allreduce(comm);
    report.check("watchdog: a timed-out allreduce aborts at once", outcome);
}

fn held_allreduce(mut comm: NcclComm) -> Result<(), String> {
    let ctx: Arc<CudaContext> = comm.device().context().clone();
    let side = ctx.new_stream().map_err(|e| e.to_string())?;
    let gate = side.alloc_zeros::<u32>(1).map_err(|e| e.to_string())?;
    side.synchronize().map_err(|e| e.to_string())?;
    let mut buf = side
        .clone_htod(&vec![1.0f32; 1024])
        .map_err(|e| e.to_string())?;
    side.synchronize().map_err(|e| e.to_string())?;
    let (word, _read) = gate.device_ptr(&side);
    // SAFETY: `word` is a live u32 of this context's device memory (freed
    // only after the release below ran); the stream is the communicator's.
    let held = unsafe {
        sys::cuStreamWaitValue32_v2(
            comm.stream().cu_stream(),
            word,
            1,
            CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
        )
    };
    if held != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuStreamWaitValue32: {held:?}"));
    }
    let outcome = check_abort(&mut comm, &mut buf);
    // Release the stream whatever happened, so that its queue drains.
    // SAFETY: as above; a synchronous one-word memset.
    let released = unsafe { sys::cuMemsetD32_v2(word, 1, 1) };
    let released = if released == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("cuMemsetD32 releasing the stream: {released:?}"))
    };
    let started = Instant::now();
    let teardown = comm.close();
    let closed = if teardown == Teardown::Aborted && started.elapsed() < TEARDOWN * 2 {
        Ok(())
    } else {
        Err(format!(
            "teardown: {teardown:?} after {:?} (want Aborted within the bound)",
            started.elapsed()
        ))
    };
    outcome.and(released).and(closed)
}

fn check_abort(
    comm: &mut NcclComm,
    buf: &mut cudarc::driver::CudaSlice<f32>,
) -> Result<(), String> {
    let work = comm
        .all_reduce(buf, ReduceOp::Sum, Scale::NONE)
        .map_err(|e| format!("enqueueing the allreduce: {e}"))?;
    let failed = work
        .wait_timeout(TIMEOUT * 40)
        .err()
        .ok_or("the held allreduce completed")?
        .to_string();
    if !(failed.contains("timed out") && failed.contains("allreduce")) {
        return Err(format!(
            "the handle failed with {failed:?}, not a timeout naming it"
        ));
    }
    // The watchdog aborts right after failing the handles, on its thread.
    let since = Instant::now();
    loop {
        let refused = match comm.flush() {
            Ok(_) => return Err("a call after the timeout was accepted".into()),
            Err(e) => e.to_string(),
        };
        if refused.contains("aborted") {
            return Ok(());
        }
        if since.elapsed() > TEARDOWN {
            return Err(format!("no abort within {TEARDOWN:?}: {refused}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
