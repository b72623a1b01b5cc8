//! When a UCX communicator's allreduce goes through
//! kolo-transport's hierarchical allreduce (reduce-scatter in the host,
//! allreduce across hosts, allgather in the host) instead of the flat
//! ring: where every rank asked for it with [`VARIABLE`], the hosts hold
//! equal numbers of ranks, there is more than one host and more than one
//! rank on each, and the buffer is at least [`MIN_BYTES`].

use crate::comm::UcxError;
use kolo_transport::algorithms::HostLayout;
use std::sync::Arc;

/// The switch, read once per communicator when it connects (Horovod's
/// `HOROVOD_HIERARCHICAL_ALLREDUCE`).
pub(crate) const VARIABLE: &str = "KOLO_HIERARCHICAL_ALLREDUCE";

/// Buffers below this take the flat allreduce even where the hierarchical
/// one is on. Up to it the flat path is recursive doubling
/// (kolo-transport's `SHORT_ALLREDUCE_BYTES`): `log2 n` whole-buffer
/// exchanges, two for 2 hosts of 2, where the hierarchical allreduce
/// takes `2 (k - 1) + 2 (h - 1)`, four, in sequence; at that size each
/// message costs its latency, not its bytes, so fewer messages win. Above
/// it the flat path is the ring, whose `2 (n - 1)` steps are more than
/// the hierarchical phases' and whose bytes cross hosts half again as
/// often.
pub(crate) const MIN_BYTES: usize = kolo_transport::algorithms::SHORT_ALLREDUCE_BYTES + 1;

/// Whether this rank asks for the hierarchical allreduce, given the
/// environment (`var` looks a variable up): `1`/`0`, `true`/`false`,
/// `yes`/`no`, `on`/`off` (case-insensitive, trimmed); unset or blank is
/// off. Anything else is an error naming the variable and the value,
/// rather than a silent flat ring.
pub(crate) fn requested(var: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    let Some(value) = var(VARIABLE) else {
        return Ok(false);
    };
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" => Ok(false),
        "1" | "true" | "yes" | "on" => Ok(true),
        _ => Err(format!(
            "{VARIABLE}={value:?}: expected 1 or 0 (or true/false, yes/no, on/off)"
        )),
    }
}

/// The layout of `hosts` seen from `rank` where the allreduce is to be
/// hierarchical: every member asked for it (one that did not would run
/// the flat ring against the others' phases) and the layout has phases to
/// run. A request that cannot be granted is logged, not an error: the
/// flat allreduce gives the same results.
pub(crate) fn agree(
    hosts: &[u64],
    askers: &[bool],
    rank: usize,
) -> std::result::Result<Option<Arc<HostLayout>>, UcxError> {
    if !askers[rank] {
        return Ok(None);
    }
    let refused: Vec<usize> = (0..askers.len()).filter(|&r| !askers[r]).collect();
    if !refused.is_empty() {
        tracing::warn!(
            "{}: ranks {refused:?} did not set it, so every rank runs the flat allreduce",
            VARIABLE
        );
        return Ok(None);
    }
    let layout = HostLayout::new(hosts, rank).map_err(|e| UcxError::Members(e.to_string()))?;
    if !layout.is_hierarchical() {
        tracing::info!(
            "{}: {} ranks on {} hosts (uneven, or one host, or one rank per host): the flat allreduce",
            VARIABLE,
            hosts.len(),
            layout.host_count()
        );
        return Ok(None);
    }
    Ok(Some(Arc::new(layout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: Option<&str>) -> Result<bool, String> {
        requested(|name| {
            assert_eq!(name, VARIABLE);
            value.map(str::to_owned)
        })
    }

    #[test]
    fn off_unless_switched_on() {
        assert_eq!(with(None), Ok(false));
        for off in ["", "  ", "0", "false", "No", "OFF"] {
            assert_eq!(with(Some(off)), Ok(false), "{off:?}");
        }
        for on in ["1", " 1\n", "true", "YES", "on"] {
            assert_eq!(with(Some(on)), Ok(true), "{on:?}");
        }
    }

    #[test]
    fn anything_else_names_the_variable() {
        let err = with(Some("2")).unwrap_err();
        assert!(
            err.contains("KOLO_HIERARCHICAL_ALLREDUCE=\"2\": expected 1 or 0"),
            "{err}"
        );
        assert!(with(Some("hierarchical")).is_err());
    }

    #[test]
    fn granted_only_where_every_rank_asks_and_the_hosts_line_up() {
        let agreed = |hosts: &[u64], askers: &[bool], rank| agree(hosts, askers, rank).unwrap();
        let layout = agreed(&[0, 0, 2, 2], &[true; 4], 2).expect("two hosts of two");
        assert_eq!(layout.cross_members(), [0, 2]);
        assert!(agreed(&[0, 0, 2, 2], &[true, true, false, true], 0).is_none());
        assert!(agreed(&[0, 0, 2, 2], &[false; 4], 0).is_none());
        assert!(agreed(&[0, 0, 0, 3], &[true; 4], 0).is_none(), "uneven");
        assert!(agreed(&[0, 0], &[true; 2], 1).is_none(), "one host");
        assert!(
            agreed(&[0, 1], &[true; 2], 1).is_none(),
            "one rank per host"
        );
    }
}
