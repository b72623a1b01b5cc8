//! The shell around [`decide`]: each rank builds its [`Offer`] (its
//! host's memory, rank 0's `--json` file opened), sends it to every rank
//! with the control plane's `allgather_bytes`, and decides from all of
//! them. Every rank makes exactly this one call whatever its arguments,
//! so the exchange itself cannot hang on a mismatch.

use super::{decide, fields, wire, Offer};
use crate::cli::Args;
use crate::engine::{measurable, EngineOptions};
use crate::error::BenchError;
use crate::json_file::JsonFile;
use crate::launcher::RankJob;
use crate::memory::available::Probe;
use crate::memory::Footprint;
use crate::plan::Plan;
use crate::report::say;
use kolo_transport::{Backend, Controller};

/// What this process proposes, the same on each of its ranks: the
/// settings to compare, and what its buffers are counted from.
#[derive(Clone, Debug)]
pub struct Proposal {
    /// See [`Offer::fields`].
    pub fields: Vec<(String, String)>,
    pub plan: Plan,
    /// Direct mode runs (alone or first with `--compare`).
    pub direct: bool,
    /// Engine mode runs, with these settings.
    pub engine: Option<EngineOptions>,
}

impl Proposal {
    /// The proposal of `args` and `plan`; `engine` when engine mode runs.
    pub fn new(args: &Args, plan: &Plan, engine: Option<EngineOptions>) -> Proposal {
        Proposal {
            fields: fields(args, plan, engine.as_ref()),
            plan: plan.clone(),
            direct: !args.engine,
            engine,
        }
    }

    /// Bytes one of `ranks` ranks allocates (see [`Footprint`]).
    pub fn need_per_rank(&self, ranks: usize) -> Option<u64> {
        Footprint {
            plan: &self.plan,
            ranks,
            direct: self.direct,
            engine: self.engine.as_ref(),
        }
        .need_per_rank()
    }

    /// Whether engine mode has any size to measure on `ranks` ranks.
    fn measurable(&self, ranks: usize) -> Result<(), BenchError> {
        match &self.engine {
            Some(options) => measurable(&self.plan, options, ranks),
            None => Ok(()),
        }
    }
}

/// Agrees with every rank of `comm` on `proposal`: `Ok` when every rank
/// may start, the same error on every rank otherwise. Rank 0 opens `json`
/// first; `local` is a problem this rank found before (its own error is
/// returned as it is, the other ranks get it as [`BenchError::PeerFailed`]).
pub fn agree<C: Controller>(
    comm: &mut C,
    proposal: &Proposal,
    json: &JsonFile,
    local: Option<BenchError>,
) -> Result<(), BenchError> {
    let rank = comm.rank();
    let own = match local {
        Some(problem) => Some(problem),
        None if rank == 0 => json.open().err(),
        None => None,
    };
    let available = Probe::default().available();
    let offer = Offer {
        fields: proposal.fields.clone(),
        need: proposal.need_per_rank(comm.size()),
        available: available.as_ref().map(|a| a.bytes),
        source: available.map(|a| a.source).unwrap_or_default(),
        local_ranks: u64::try_from(comm.local_size()).unwrap_or(u64::MAX),
        problem: own.as_ref().map(ToString::to_string),
    };
    let all = comm
        .allgather_bytes(&wire::encode(&offer))
        .map_err(|source| BenchError::Exchange { rank, source })?;
    let offers = all
        .iter()
        .enumerate()
        .map(|(r, bytes)| wire::decode(bytes, r))
        .collect::<Result<Vec<_>, _>>()?;
    match (decide(&offers), own) {
        (Err(BenchError::PeerFailed { rank: failed, .. }), Some(own)) if failed == rank => Err(own),
        // The plans agree: every rank finds the same answer.
        (Ok(()), _) => proposal.measurable(comm.size()),
        (verdict, _) => verdict,
    }
}

/// [`agree`] on a rank that is a process of its own (under mpirun or
/// kolo-run). A refusal is written to stderr at once, and the ranks meet
/// once more before any of them returns: the launcher ends the job at the
/// first rank that exits non-zero and kills the others where they stand,
/// so a rank still on its way to saying why it stopped would lose its
/// line. The error comes back as [`BenchError::Said`].
pub fn agree_as_process<C: Controller>(
    comm: &mut C,
    proposal: &Proposal,
    json: &JsonFile,
    local: Option<BenchError>,
) -> Result<(), BenchError> {
    agree(comm, proposal, json, local).map_err(|refusal| {
        say(&format!("kolo-bench: {refusal}"));
        // Every rank reached the same verdict and makes this call; one
        // that cannot meet the others has said its part already.
        let _ = comm.control_barrier();
        BenchError::Said(Box::new(refusal))
    })
}

/// [`agree`] as a job of every rank a launcher hosts; each rank's output
/// is its verdict.
#[derive(Debug)]
pub struct AgreeJob<'a> {
    pub proposal: &'a Proposal,
    pub json: &'a JsonFile,
}

impl RankJob for AgreeJob<'_> {
    type Output = Result<(), BenchError>;

    fn run<B: Backend>(&self, comm: &mut B) -> Result<Self::Output, BenchError> {
        Ok(agree(comm, self.proposal, self.json, None))
    }
}
