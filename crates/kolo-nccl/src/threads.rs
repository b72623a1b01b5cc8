//! Thread mode in one call: one thread per GPU, each with a kolo-threads
//! controller and an [`NcclComm`] on device `rank`.

use crate::comm::{Mode, NcclComm, NcclOptions};
use crate::error::NcclError;
use crate::work::Health;
use kolo_threads::{RunError, ThreadComm};
use parking_lot::Mutex;
use std::sync::Arc;

/// Runs `f` on `gpus` threads, rank r on device r (unless
/// `options.device` pins one), and returns the results in rank order.
///
/// Communicators are created with [`NcclComm::init`] over
/// kolo-threads' controllers, in thread mode unless `options.mode` says
/// otherwise. When a rank fails (its `f` returns an error
/// or panics), the other ranks' communicators are marked broken so their
/// pending GPU work fails promptly instead of waiting out the operation
/// timeout; the error lists every failed rank, root cause first.
pub fn run<R, F>(gpus: usize, options: NcclOptions, f: F) -> Result<Vec<R>, RunError>
where
    R: Send,
    F: Fn(&mut NcclComm, &mut ThreadComm) -> Result<R, NcclError> + Sync,
{
    let healths: Mutex<Vec<Arc<Health>>> = Mutex::new(Vec::new());
    let break_all = |rank: usize, e: &NcclError| {
        let cause = NcclError::Bootstrap {
            rank,
            message: format!("a peer thread failed: {e}"),
        };
        for health in healths.lock().iter() {
            health.fail(&cause);
        }
    };
    kolo_threads::run(gpus, |ctrl| {
        let rank = kolo_transport::Topology::rank(ctrl);
        let mut opts = options.clone();
        opts.device = opts.device.or(Some(rank));
        opts.mode = opts.mode.or(Some(Mode::ThreadPerGpu));
        let mut comm = NcclComm::init(ctrl, opts).inspect_err(|e| break_all(rank, e))?;
        healths.lock().push(comm.health.clone());
        let out = f(&mut comm, ctrl);
        if let Err(e) = &out {
            break_all(rank, e);
        }
        out
    })
}
