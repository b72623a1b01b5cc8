//! The threads backend: `ranks` threads of this process, each with a
//! `kolo_threads::ThreadComm`.

use super::{Launcher, RankJob};
use crate::error::BenchError;

/// Runs a job on `ranks` in-process ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadsLauncher {
    pub ranks: usize,
}

impl Launcher for ThreadsLauncher {
    fn name(&self) -> &'static str {
        "threads"
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn launch<J: RankJob>(&self, job: &J) -> Result<Vec<J::Output>, BenchError> {
        kolo_threads::run(self.ranks, |comm| job.run(comm)).map_err(|e| BenchError::Launch {
            backend: "threads",
            message: e.to_string(),
        })
    }
}
