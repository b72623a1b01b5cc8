//! Process sets of UCX processes: the members post their workers'
//! addresses in the job's rendezvous store under the set's own keys and
//! connect to one another; ranks outside the set take no part.

use crate::config::Config;
use crate::engine::watchdog::Guards;
use crate::error::Error;
use crate::kolo::{Kolo, SetMaker};
use crate::set_label::SetLabel;
use crate::store_bulletin::StoreBulletin;
use kolo_rendezvous::{Client, Rendezvous};
use kolo_timeline::Timeline;
use kolo_ucx::UcxComm;
use std::sync::Arc;
use std::time::Duration;

/// How long the members wait for one another where no operation timeout
/// bounds it (`KOLO_TIMEOUT=0`): a member that never comes is then a
/// programming error, reported after a day rather than never.
const UNBOUNDED_MEETING: Duration = Duration::from_secs(24 * 60 * 60);

/// One process's way to make sets: where the job's store is, and who it
/// is there.
pub(crate) struct UcxSetMaker {
    address: String,
    token: Option<String>,
    /// How long connecting to the store may take.
    connect: Duration,
    rank: usize,
    /// The job rank of the first rank of this host (as `UcxComm` names
    /// hosts).
    host: u64,
}

impl UcxSetMaker {
    /// The maker of the job `rendezvous` joined.
    pub(crate) fn of(rendezvous: &mut Rendezvous) -> UcxSetMaker {
        let vars = rendezvous.vars().clone();
        UcxSetMaker {
            address: rendezvous.client().address().to_owned(),
            token: vars.token,
            connect: vars.timeout,
            rank: vars.rank,
            host: (vars.rank - vars.local_rank) as u64,
        }
    }
}

impl SetMaker for UcxSetMaker {
    fn start(&self, label: &SetLabel, config: &Config) -> Result<Kolo, Error> {
        let refuse = |what: &str, e: &dyn std::fmt::Display| Error::ProcessSet {
            members: label.members.clone(),
            reason: format!("{what}: {e}"),
        };
        let space = format!("kolo/set/{}", label.key());
        let meeting = config.timeout.unwrap_or(UNBOUNDED_MEETING);
        let mut client = Client::connect(&self.address, self.token.as_deref(), self.connect)
            .map_err(|e| refuse("cannot reach the job's store", &e))?;
        let comm = UcxComm::connect_members(
            &mut client,
            &space,
            self.rank,
            self.host,
            &label.members,
            meeting,
        )
        .map_err(|e| refuse("cannot connect its members over UCX", &e))?;
        let interrupter = comm.interrupter();
        let guards = Guards {
            interrupt: Some(Arc::new(move |why: &str| interrupter.interrupt(why))),
            bulletin: Some(StoreBulletin::of_set(client, space)),
        };
        Kolo::start_sharing(
            comm,
            config.clone(),
            |_: &mut UcxComm, _: &str| {},
            // The timeline is the world's (rank 0's file): a set writes none.
            Some(Timeline::disabled()),
            guards,
        )
    }
}
