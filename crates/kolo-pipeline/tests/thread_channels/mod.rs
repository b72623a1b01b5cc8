//! Channel sets over kolo-threads for the threads tests: a two-rank
//! communicator per channel (`pair_channels`), or a world communicator per
//! channel taken by each rank (what `MpiComm::duplicate` gives each rank,
//! for `duplicate_channels`).

use kolo_pipeline::{pair_channels, ChannelKey, ChannelSet, Options, PipelineError, PipelineSpec};
use kolo_threads::ThreadComm;
use std::collections::HashMap;
use std::sync::Mutex;

/// Each rank's set, taken once by its thread.
pub type Sets = Vec<Mutex<Option<ChannelSet<ThreadComm>>>>;

/// A two-rank kolo-threads communicator per channel (`pair_channels`).
pub fn thread_channels(spec: &PipelineSpec, options: &Options) -> Sets {
    let sets = pair_channels(spec, options, |_| {
        let mut comms =
            kolo_threads::communicators(2).map_err(|e| PipelineError::Start(e.to_string()))?;
        let receiver = comms.pop();
        comms
            .pop()
            .zip(receiver)
            .ok_or_else(|| PipelineError::Start("no communicators".into()))
    })
    .unwrap_or_else(|e| panic!("channels: {e}"));
    sets.into_iter().map(|s| Mutex::new(Some(s))).collect()
}

/// A world communicator per channel of the whole pipeline, each rank's
/// end taken by that rank: what `MpiComm::duplicate` gives each rank.
pub struct WorldChannels(HashMap<ChannelKey, Vec<Mutex<Option<ThreadComm>>>>);

impl WorldChannels {
    pub fn take(&self, key: &ChannelKey, rank: usize) -> Result<ThreadComm, PipelineError> {
        self.0
            .get(key)
            .and_then(|comms| comms.get(rank))
            .and_then(|slot| slot.lock().ok()?.take())
            .ok_or_else(|| PipelineError::Start(format!("no duplicate of {key} for rank {rank}")))
    }
}

pub fn world_channels(spec: &PipelineSpec, options: &Options) -> WorldChannels {
    let keys = kolo_pipeline::channels(spec, options).unwrap_or_else(|e| panic!("{e}"));
    WorldChannels(
        keys.into_iter()
            .map(|key| {
                let comms =
                    kolo_threads::communicators(spec.world_size).unwrap_or_else(|e| panic!("{e}"));
                (
                    key,
                    comms.into_iter().map(|c| Mutex::new(Some(c))).collect(),
                )
            })
            .collect(),
    )
}
