//! What the user's threads and the engine's share: the tensor table and
//! the counters.

use crate::engine::autotune::Autotune;
use crate::engine::desync::Standing;
use crate::engine::table::Table;
use crate::error::Error;
use crate::stats::Stats;
use parking_lot::Mutex;

/// State shared by the user's threads and the background thread.
#[derive(Default)]
pub(crate) struct Shared {
    pub table: Mutex<Table>,
    pub stats: Mutex<Stats>,
    /// The operation timeout when it, not the stall shutdown, fails the
    /// tensors some ranks did not submit (see
    /// [`crate::Config::timeout`]).
    pub stall_timeout: Option<std::time::Duration>,
    /// Where this rank stood when its engine stopped for a failure (see
    /// [`crate::engine::desync`]), taken before its handles were failed.
    pub final_standing: Mutex<Option<Standing>>,
    /// The autotuner's state, published by the engine (`None` before it
    /// starts).
    pub autotune: Mutex<Option<Autotune>>,
}

/// Closes the table with `reason` and fails every submission still queued.
pub(crate) fn fail_all(shared: &Shared, reason: Error) {
    let queued = shared.table.lock().close(reason.clone());
    for completion in queued {
        completion.fail_open(|_| reason.clone());
    }
}
