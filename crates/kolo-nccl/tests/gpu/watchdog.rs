//! The completion thread's watchdog on a real GPU: an allreduce that never
//! completes fails its handle with a timeout naming it, the watchdog
//! aborts the communicator right then (not at teardown), later calls are
//! refused saying so, and the teardown ends within its bound.
//!
//! What holds the operation back is a host function enqueued on the
//! communication stream before it (`cuLaunchHostFunc`) that waits for a
//! flag only the test sets: one GPU cannot make NCCL itself wait for a
//! missing peer (NCCL refuses two ranks on one device), and the hold is
//! released afterwards, so the GPU is left as it was found. With a GPU per
//! rank, the other ranks' NCCL kernels wait for the held one, and it is
//! the abort that ends them.

use super::{err, Report};
use cudarc::driver::sys;
use kolo_nccl::{NcclComm, NcclOptions, Teardown};
use kolo_protocol::ReduceOp;
use kolo_transport::{Controller, Scale};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// The most a hold lasts if the test never released it (a failed check):
/// the stream then drains by itself.
const HOLD_LIMIT: Duration = Duration::from_secs(60);

/// The host function holding the stream: returns once the flag at
/// `released` is set, or after [`HOLD_LIMIT`].
unsafe extern "C" fn hold(released: *mut c_void) {
    // SAFETY: `released` is the `AtomicBool` that `held_allreduce` leaked
    // for this hold, so it outlives every call.
    let released = unsafe { &*(released as *const AtomicBool) };
    let since = Instant::now();
    while !released.load(Ordering::Acquire) && since.elapsed() < HOLD_LIMIT {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn held_allreduce(mut comm: NcclComm) -> Result<(), String> {
    let stream = comm.stream().clone();
    let mut buf = stream
        .clone_htod(&vec![1.0f32; 1024])
        .map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    // Leaked: the driver's thread may still read it after this returns.
    let released: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    // SAFETY: `hold` makes no CUDA call and reads `released`, which lives
    // for the rest of the process; the stream is the communicator's.
    let held = unsafe {
        sys::cuLaunchHostFunc(
            stream.cu_stream(),
            Some(hold),
            released as *const AtomicBool as *mut c_void,
        )
    };
    if held != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuLaunchHostFunc: {held:?}"));
    }
    let outcome = check_abort(&mut comm, &mut buf, released);
    released.store(true, Ordering::Release);
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
    outcome.and(closed)
}

fn check_abort(
    comm: &mut NcclComm,
    buf: &mut cudarc::driver::CudaSlice<f32>,
    released: &AtomicBool,
) -> Result<(), String> {
    let work = comm
        .all_reduce(buf, ReduceOp::Sum, Scale::NONE)
        .map_err(|e| format!("enqueueing the allreduce: {e}"))?;
    let failed = work
        .wait_timeout(TIMEOUT * 40)
        .err()
        .ok_or("the held allreduce completed")?
        .to_string();
    // The handle's failure is seen only once the communicator is marked
    // broken, so nothing submitted now is accepted.
    let refused = comm.flush().err().map(|e| e.to_string());
    // `ncclCommAbort` waits for the stream's queue too, held here by a
    // host function it cannot end: release it (as the abort ends NCCL's
    // own kernels waiting for a peer). The teardown, still to come, would
    // abort as well; the error saying so before it is the watchdog's.
    released.store(true, Ordering::Release);
    if !(failed.contains("timed out") && failed.contains("allreduce")) {
        return Err(format!(
            "the handle failed with {failed:?}, not a timeout naming it"
        ));
    }
    if refused.is_none() {
        return Err("a call right after the timeout was accepted".into());
    }
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
