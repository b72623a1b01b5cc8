//! A second rail for [`UcxComm`]'s large allreduces over TCP: a second
//! worker with its own endpoints (its own sockets) to every rank, owned by
//! a thread of its own for the communicator's life (kolo-transport's
//! [`RailThread`]), which carries half of each buffer while the calling
//! thread carries the other ([`threaded_rail_allreduce`](kolo_transport::algorithms::threaded_rail_allreduce)).
//! The thread is started once the rail is connected and ends when the
//! communicator is dropped; a part is handed to it, and its end back,
//! through a slot both sides poll (yielding the CPU between polls) for
//! [`HANDOFF_SPIN`] before they park, so an allreduce pays no thread
//! start and, back to back, no wake.
//!
//! Over TCP a process moves every byte through a `send` and a `recv`
//! system call, each a copy by the core that makes it: one worker, driven
//! by one thread, is bound by one core's copying, and the ring allreduce
//! reached 0.8-0.95x OpenMPI's at 1-16 MiB on a 16-core host however its
//! messages were cut (one per step or in segments, streamed or in turn,
//! eager or rendezvous: all within the run-to-run noise). Two rails copy
//! on two cores. Shared memory keeps one rail: there a process copies once,
//! straight into its peer, and one rail already beats OpenMPI's (two were
//! not measured).
//!
//! A world communicator ([`UcxComm::connect`]) gets the rail where every
//! rank asks for it: by [`VARIABLE`] (`1` or `2` rails), or by default
//! where `UCX_TLS` names TCP and no other transport but `self`.

use crate::comm::{UcxComm, UcxError};
use crate::safe::worker::Worker;
use kolo_rendezvous::Rendezvous;
use kolo_transport::algorithms::RailThread;
use kolo_transport::Controller;
use std::time::Duration;

/// Rails of a world communicator: `1` or `2`.
pub(crate) const VARIABLE: &str = "KOLO_UCX_RAILS";

/// Buffers below this take the one rail: below it each part's ring
/// steps cost their latency more than their bytes. Measured over TCP on a
/// 16-core host: at 256 KiB two rails gave 1.4x one's busbw at 2 ranks
/// and 1.1x at 4; at 128 KiB 1.5x at 2 ranks but nothing at 4.
pub(crate) const MIN_BYTES: usize = 256 << 10;

/// How long the caller and the rail's thread poll a hand-off before they
/// park: longer than the gap between back-to-back allreduces (a
/// benchmark's copy of its input and barrier between them, 0.3-0.5 ms at
/// 4 MiB) and than the two parts' usual difference, short beside a
/// training step. Measured over TCP on a 16-core host at 4 ranks and
/// 1-4 MiB (medians of 3 rounds): against 2 ms, not polling lost up to
/// half of the busbw, 200 µs up to a fifth. Zero where the host's ranks
/// take all its cores.
pub(crate) const HANDOFF_SPIN: Duration = Duration::from_millis(2);

/// Whether this rank asks for the second rail, given the environment
/// (`var` looks a variable up): [`VARIABLE`] where set (`1` or `2`,
/// anything else an error naming it), else where `UCX_TLS` lists `tcp`
/// and nothing but `tcp` and `self` (entries may carry `:aux`).
pub(crate) fn requested(var: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    if let Some(value) = var(VARIABLE).filter(|v| !v.trim().is_empty()) {
        return match value.trim() {
            "1" => Ok(false),
            "2" => Ok(true),
            _ => Err(format!("{VARIABLE}={value:?}: expected 1 or 2")),
        };
    }
    let Some(tls) = var("UCX_TLS") else {
        return Ok(false);
    };
    let names: Vec<String> = tls
        .split(',')
        .map(|entry| {
            entry
                .split(':')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    let tcp_only = names.iter().all(|n| n == "tcp" || n == "self");
    Ok(tcp_only && names.iter().any(|n| n == "tcp"))
}

/// The second rail of `comm`, a communicator of every rank of
/// `rendezvous`'s job in job order (every rank calls it, after the
/// communicator connected): `Some` where every rank asked for it.
pub(crate) fn connect(
    rendezvous: &mut Rendezvous,
    comm: &UcxComm,
    asks: bool,
) -> Result<Option<UcxComm>, UcxError> {
    // A rail that cannot be made leaves this communicator with one, on
    // every rank: this rank says so instead of failing the others' wait.
    let made = asks.then(|| Worker::new().and_then(|w| Ok((w.address()?, w))));
    let worker = match made {
        Some(Ok(made)) => Some(made),
        Some(Err(e)) => {
            tracing::warn!("{VARIABLE}: no second rail ({e}): every rank keeps one");
            None
        }
        None => None,
    };
    // Whether this rank asks, its host's first rank, its worker's address.
    let host = (rendezvous.rank() - rendezvous.local_rank()) as u64;
    let mine = match &worker {
        Some((address, _)) => [&[1u8][..], &host.to_le_bytes(), address].concat(),
        None => vec![0u8],
    };
    let all = rendezvous.allgather("ucx/rail", &mine)?;
    let mut hosts = Vec::with_capacity(all.len());
    let mut addresses = Vec::with_capacity(all.len());
    for entry in &all {
        let parsed = entry
            .split_first()
            .filter(|(&asks, _)| asks == 1)
            .and_then(|(_, rest)| rest.split_first_chunk::<8>());
        let Some((host, address)) = parsed else {
            break;
        };
        hosts.push(u64::from_le_bytes(*host));
        addresses.push(address.to_vec());
    }
    let Some((_, worker)) = worker.filter(|_| addresses.len() == all.len()) else {
        rendezvous.barrier("ucx/rail")?;
        return Ok(None);
    };
    let local_world = rendezvous.local_world_size();
    let mut rail = UcxComm::assemble(worker, comm.rank, &hosts, &addresses, local_world, None)?;
    // The watchdog's interruption ends both rails' waits.
    rail.interrupter = comm.interrupter.clone();
    rail.control_barrier()
        .map_err(|e| crate::result::UcsError {
            call: "the first barrier over the second rail",
            status: 0,
            text: e.to_string(),
        })?;
    rendezvous.barrier("ucx/rail")?;
    Ok(Some(rail))
}

/// `rail` on its thread; its hand-offs do not poll where the host is
/// `crowded` (its ranks' threads take all its cores).
pub(crate) fn start(rail: UcxComm, crowded: bool) -> Result<RailThread<UcxComm>, UcxError> {
    let spin = if crowded {
        Duration::ZERO
    } else {
        HANDOFF_SPIN
    };
    RailThread::start(rail, spin).map_err(UcxError::RailThread)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<bool, String> {
        requested(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn by_default_only_over_tcp_alone() {
        assert_eq!(with(&[("UCX_TLS", "tcp,self")]), Ok(true));
        assert_eq!(with(&[("UCX_TLS", "TCP")]), Ok(true));
        assert_eq!(with(&[("UCX_TLS", "tcp:aux,self")]), Ok(true));
        assert_eq!(with(&[]), Ok(false), "UCX picks: shared memory on a host");
        assert_eq!(with(&[("UCX_TLS", "sm,self")]), Ok(false));
        assert_eq!(with(&[("UCX_TLS", "sm,tcp,self")]), Ok(false));
        assert_eq!(with(&[("UCX_TLS", "^sm")]), Ok(false));
        assert_eq!(with(&[("UCX_TLS", "self")]), Ok(false));
    }

    #[test]
    fn the_variable_rules_and_names_itself_when_wrong() {
        assert_eq!(with(&[(VARIABLE, "2"), ("UCX_TLS", "sm")]), Ok(true));
        assert_eq!(with(&[(VARIABLE, " 1 "), ("UCX_TLS", "tcp")]), Ok(false));
        assert_eq!(with(&[(VARIABLE, ""), ("UCX_TLS", "tcp")]), Ok(true));
        let err = with(&[(VARIABLE, "3")]).unwrap_err();
        assert!(
            err.contains("KOLO_UCX_RAILS=\"3\": expected 1 or 2"),
            "{err}"
        );
    }
}
