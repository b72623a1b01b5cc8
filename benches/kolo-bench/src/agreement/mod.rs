//! The ranks agree on their plan before any of them starts the sweep.
//!
//! Under `mpirun` every rank parses its own arguments, and ranks given
//! different ones (`mpirun -np 1 kolo-bench A : -np 1 kolo-bench B`) would
//! run different collectives, counts or iteration numbers against each
//! other: a hang, or wrong results reported as the benchmark's. So each
//! rank first sends every other an [`Offer`]: the settings that must be
//! equal (as `(name, value)` fields, named the way the user gave them),
//! plus what only it knows (the memory its host has, a problem it found
//! such as a `--json` file it cannot create). [`decide`] is a pure
//! function of every rank's offer, so every rank reaches the same verdict
//! and they all stop, or all go on, together. [`exchange`] is the thin
//! shell that sends the offers over the backend's control plane.

pub mod exchange;
pub mod wire;

use crate::cli::Args;
use crate::engine::EngineOptions;
use crate::error::BenchError;
use crate::plan::Plan;
use crate::size::describe_bytes;

/// One rank's side of the agreement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offer {
    /// The settings every rank must share, in the order they are compared.
    pub fields: Vec<(String, String)>,
    /// Bytes this rank's part of the run allocates (`None`: more than
    /// 2^64).
    pub need: Option<u64>,
    /// Bytes this rank's host can still allocate, if known.
    pub available: Option<u64>,
    /// Where `available` comes from.
    pub source: String,
    /// Ranks on this rank's host (whose needs add up there).
    pub local_ranks: u64,
    /// Why this rank cannot run, found before the exchange.
    pub problem: Option<String>,
}

/// The settings of `args` and `plan` that every rank must share, named as
/// on the command line; `engine` when engine mode runs (`--engine`,
/// `--compare`).
pub fn fields(args: &Args, plan: &Plan, engine: Option<&EngineOptions>) -> Vec<(String, String)> {
    let on_off = |on: bool| if on { "on" } else { "off" }.to_string();
    let mode = if args.compare {
        "--compare"
    } else if args.engine {
        "--engine"
    } else {
        "direct (no --engine, no --compare)"
    };
    let ops: Vec<&str> = plan.ops.iter().map(|op| op.name()).collect();
    let mut fields = vec![
        ("kolo-bench version", env!("CARGO_PKG_VERSION").to_string()),
        ("--backend", args.backend.name().to_string()),
        ("mode", mode.to_string()),
        ("--op", ops.join(",")),
        ("--dtype", plan.dtype.name().to_string()),
        ("--redop", plan.redop.name().to_string()),
        ("--min-bytes", args.min_bytes.to_string()),
        ("--max-bytes", args.max_bytes.to_string()),
        ("--factor", args.factor.to_string()),
        ("--iters", plan.iters.to_string()),
        ("--warmup", plan.warmup.to_string()),
        ("--check", on_off(plan.check)),
        ("the plain-MPI baseline", on_off(plan.baseline)),
    ];
    if args.backend == crate::launcher::BackendKind::Threads {
        fields.push(("--ranks", args.ranks.to_string()));
    }
    if let Some(options) = engine {
        let submission = options.submission;
        let how = match (submission.tensor_group, submission.grouped) {
            (true, _) => "--tensor-group",
            (false, true) => "--grouped",
            (false, false) => "one tensor at a time",
        };
        fields.extend([
            ("--tensors", options.tensors.to_string()),
            ("submission", how.to_string()),
            (
                "fusion threshold (--fusion-threshold, KOLO_FUSION_THRESHOLD)",
                format!("{} B", options.config.fusion_threshold),
            ),
            (
                "cycle time (--cycle-time, KOLO_CYCLE_TIME)",
                format!("{} ms", options.config.cycle_time.as_secs_f64() * 1e3),
            ),
        ]);
    }
    fields
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect()
}

/// What rank `rank` says for `name`.
fn value<'a>(offers: &'a [Offer], rank: usize, name: &str) -> Option<&'a str> {
    offers[rank]
        .fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The first setting on which a rank differs from rank 0: fields in rank
/// 0's order (then fields only other ranks have), and for each the lowest
/// rank that differs.
pub fn first_disagreement(offers: &[Offer]) -> Option<BenchError> {
    let mut names: Vec<&str> = Vec::new();
    for offer in offers {
        for (name, _) in &offer.fields {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    const NONE: &str = "nothing (an older or newer kolo-bench?)";
    for name in names {
        let first = value(offers, 0, name);
        if let Some(rank) = (1..offers.len()).find(|&r| value(offers, r, name) != first) {
            return Some(BenchError::Disagreement {
                field: name.to_string(),
                first_rank: 0,
                first_value: first.unwrap_or(NONE).to_string(),
                rank,
                value: value(offers, rank, name).unwrap_or(NONE).to_string(),
            });
        }
    }
    None
}

/// Whether the run can start, from every rank's offer (in rank order):
/// the first disagreement, then the first rank's problem, then the first
/// host short of memory, is the error; every rank computes the same one.
pub fn decide(offers: &[Offer]) -> Result<(), BenchError> {
    if let Some(disagreement) = first_disagreement(offers) {
        return Err(disagreement);
    }
    if let Some((rank, problem)) = offers
        .iter()
        .enumerate()
        .find_map(|(rank, o)| o.problem.as_ref().map(|p| (rank, p)))
    {
        return Err(BenchError::PeerFailed {
            rank,
            message: problem.clone(),
        });
    }
    for (rank, offer) in offers.iter().enumerate() {
        let Some(need) = offer.need else {
            return Err(BenchError::TooLarge {
                what: format!(
                    "--max-bytes {}",
                    value(offers, 0, "--max-bytes").unwrap_or("?")
                ),
            });
        };
        let Some(available) = offer.available else {
            continue;
        };
        let total = need.checked_mul(offer.local_ranks.max(1));
        if total.is_none_or(|total| total > available) {
            return Err(BenchError::OutOfMemory {
                rank,
                need: describe_bytes(need),
                local_ranks: offer.local_ranks,
                total: total.map_or_else(|| "more than 2^64 B".into(), describe_bytes),
                available: describe_bytes(available),
                origin: offer.source.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
