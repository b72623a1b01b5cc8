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
//! where `UCX_TLS` names TCP and no other transport but `self` and every
//! machine of the job has a core for each waiting thread of its ranks
//! (two each). A machine is what its processes share cores on: the
//! kernel's boot id, the same in every network namespace and container of
//! a host, whatever hosts the launcher counted. Where its ranks would
//! outnumber its cores, the rail threads only take turns with the ranks
//! they wait for: across two namespaces of a 2-core machine one rail
//! moved 16 and 64 MiB in 0.93-0.95x the two rails' time (1 MiB in
//! 1.05-1.07x), and with the 256 KiB segments of a job across hosts
//! ([`crate::tuning`]) 1 MiB in 0.82-0.92x and 16 MiB in 0.82x.

use crate::comm::{UcxComm, UcxError};
use crate::safe::worker::Worker;
use kolo_rendezvous::Rendezvous;
use kolo_transport::algorithms::RailThread;
use kolo_transport::Controller;
use std::collections::{HashMap, HashSet};
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

/// What a rank asks for: the second rail or not, and whether its user
/// said so ([`VARIABLE`]) or kolo chose from `UCX_TLS`, in which case the
/// machines' cores have their say too ([`take_rail`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) rail: bool,
    pub(crate) by_user: bool,
}

/// This rank's request, given the environment (`var` looks a variable
/// up): [`VARIABLE`] where set (`1` or `2`, anything else an error naming
/// it), else the rail where `UCX_TLS` lists `tcp` and nothing but `tcp`
/// and `self` (entries may carry `:aux`).
pub(crate) fn requested(var: impl Fn(&str) -> Option<String>) -> Result<Request, String> {
    if let Some(value) = var(VARIABLE).filter(|v| !v.trim().is_empty()) {
        let rail = match value.trim() {
            "1" => false,
            "2" => true,
            _ => return Err(format!("{VARIABLE}={value:?}: expected 1 or 2")),
        };
        return Ok(Request {
            rail,
            by_user: true,
        });
    }
    let by_kolo = |rail| Request {
        rail,
        by_user: false,
    };
    let Some(tls) = var("UCX_TLS") else {
        return Ok(by_kolo(false));
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
    Ok(by_kolo(tcp_only && names.iter().any(|n| n == "tcp")))
}

/// What each asking rank tells the others about where it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seat {
    /// Its user asked for the rail ([`Request::by_user`]).
    pub(crate) by_user: bool,
    /// Its machine ([`machine`]).
    pub(crate) machine: u64,
    /// The cores it may use.
    pub(crate) cores: usize,
}

/// The machines among `seats` whose ranks outnumber half their cores (the
/// fewest any of their ranks may use): with a rail each, those ranks'
/// waiting threads would take turns on the cores.
pub(crate) fn crowded_machines(seats: &[Seat]) -> HashSet<u64> {
    let mut tally: HashMap<u64, (usize, usize)> = HashMap::new();
    for seat in seats {
        let (ranks, cores) = tally.entry(seat.machine).or_insert((0, usize::MAX));
        *ranks += 1;
        *cores = (*cores).min(seat.cores);
    }
    tally
        .into_iter()
        .filter(|(_, (ranks, cores))| 2 * ranks > *cores)
        .map(|(machine, _)| machine)
        .collect()
}

/// Whether the job, every rank of which asked for the rail, takes it:
/// each rank's user asked, or its machine is not among `crowded`. Every
/// rank decides from the same seats, so all decide alike.
pub(crate) fn take_rail(seats: &[Seat], crowded: &HashSet<u64>) -> bool {
    seats
        .iter()
        .all(|seat| seat.by_user || !crowded.contains(&seat.machine))
}

/// The machine this process runs on, as every process on it sees it: a
/// hash of the kernel's boot id, shared by the network namespaces and
/// containers of one host, which share its cores; where it cannot be read,
/// the launcher's `host` (the first rank of this rank's host).
pub(crate) fn machine(host: u64) -> u64 {
    match std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        // FNV-1a: stable across processes and builds, unlike std's hasher.
        Ok(id) => id.trim().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        }),
        Err(_) => host | 1 << 63,
    }
}

/// A connected second rail, and whether its machine is crowded
/// ([`crowded_machines`]).
pub(crate) struct Rail {
    comm: UcxComm,
    pub(crate) crowded: bool,
}

/// The second rail of `comm`, a communicator of every rank of
/// `rendezvous`'s job in job order (every rank calls it, after the
/// communicator connected): `Some` where every rank asked for it and
/// [`take_rail`] agrees.
pub(crate) fn connect(
    rendezvous: &mut Rendezvous,
    comm: &UcxComm,
    request: Request,
) -> Result<Option<Rail>, UcxError> {
    // A rail that cannot be made leaves this communicator with one, on
    // every rank: this rank says so instead of failing the others' wait.
    let across_hosts = rendezvous.local_world_size() < rendezvous.world_size();
    let made = request
        .rail
        .then(|| Worker::new(across_hosts).and_then(|w| Ok((w.address()?, w))));
    let worker = match made {
        Some(Ok(made)) => Some(made),
        Some(Err(e)) => {
            tracing::warn!("{VARIABLE}: no second rail ({e}): every rank keeps one");
            None
        }
        None => None,
    };
    // Whether this rank asks, whether its user did, its host's first
    // rank, its machine, its cores, its worker's address.
    let host = (rendezvous.rank() - rendezvous.local_rank()) as u64;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mine = match &worker {
        Some((address, _)) => [
            &[1u8, u8::from(request.by_user)][..],
            &host.to_le_bytes(),
            &machine(host).to_le_bytes(),
            &(cores as u64).to_le_bytes(),
            address,
        ]
        .concat(),
        None => vec![0u8],
    };
    let all = rendezvous.allgather("ucx/rail", &mine)?;
    let mut hosts = Vec::with_capacity(all.len());
    let mut seats = Vec::with_capacity(all.len());
    let mut addresses = Vec::with_capacity(all.len());
    for entry in &all {
        let Some(([1, by_user], rest)) = entry.split_first_chunk::<2>() else {
            break;
        };
        let Some((fields, address)) = rest.split_first_chunk::<24>() else {
            break;
        };
        let word = |i: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&fields[8 * i..8 * i + 8]);
            u64::from_le_bytes(bytes)
        };
        hosts.push(word(0));
        seats.push(Seat {
            by_user: *by_user != 0,
            machine: word(1),
            cores: usize::try_from(word(2)).unwrap_or(usize::MAX),
        });
        addresses.push(address.to_vec());
    }
    let every_rank_asked = addresses.len() == all.len();
    let crowded = crowded_machines(&seats);
    let Some((_, worker)) = worker.filter(|_| every_rank_asked && take_rail(&seats, &crowded))
    else {
        rendezvous.barrier("ucx/rail")?;
        return Ok(None);
    };
    let crowded = crowded.contains(&seats[comm.rank].machine);
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
    Ok(Some(Rail {
        comm: rail,
        crowded,
    }))
}

/// `rail` on its thread; where its machine is crowded (its user asked
/// for it all the same), neither it nor its hand-offs poll.
pub(crate) fn start(rail: Rail) -> Result<RailThread<UcxComm>, UcxError> {
    let Rail { mut comm, crowded } = rail;
    let spin = if crowded {
        comm.spin_polls = 0;
        Duration::ZERO
    } else {
        HANDOFF_SPIN
    };
    RailThread::start(comm, spin).map_err(UcxError::RailThread)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<bool, String> {
        requested_by(vars).map(|r| r.rail)
    }

    fn requested_by(vars: &[(&str, &str)]) -> Result<Request, String> {
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

    #[test]
    fn the_variable_is_the_users_word_and_tls_is_kolos() {
        let user = requested_by(&[(VARIABLE, "2"), ("UCX_TLS", "tcp")]).unwrap();
        assert_eq!((user.rail, user.by_user), (true, true));
        let kolo = requested_by(&[("UCX_TLS", "tcp")]).unwrap();
        assert_eq!((kolo.rail, kolo.by_user), (true, false));
    }

    fn seat(machine: u64, cores: usize, by_user: bool) -> Seat {
        Seat {
            by_user,
            machine,
            cores,
        }
    }

    fn takes(seats: &[Seat]) -> bool {
        take_rail(seats, &crowded_machines(seats))
    }

    #[test]
    fn a_machine_is_crowded_where_its_ranks_outnumber_half_its_cores() {
        // Two namespaces of one 2-core machine: one rank each, 2 threads each.
        let shared = [seat(7, 2, false), seat(7, 2, false)];
        assert_eq!(crowded_machines(&shared), HashSet::from([7]));
        assert!(!takes(&shared));
        // The same two ranks on two machines of 2 cores.
        let apart = [seat(7, 2, false), seat(8, 2, false)];
        assert!(crowded_machines(&apart).is_empty());
        assert!(takes(&apart));
        // Four ranks on 8 cores fit; a fifth does not.
        let four: Vec<Seat> = (0..4).map(|_| seat(1, 8, false)).collect();
        assert!(takes(&four));
        let five: Vec<Seat> = (0..5).map(|_| seat(1, 8, false)).collect();
        assert!(!takes(&five));
        // The fewest cores any rank of the machine may use count.
        let uneven = [seat(1, 16, false), seat(1, 3, false)];
        assert_eq!(crowded_machines(&uneven), HashSet::from([1]));
    }

    #[test]
    fn one_crowded_machine_keeps_the_whole_job_on_one_rail_unless_its_users_asked() {
        let mixed = [
            seat(1, 16, false),
            seat(1, 16, false),
            seat(2, 2, false),
            seat(2, 2, false),
        ];
        assert!(!takes(&mixed));
        let asked = [
            seat(1, 16, false),
            seat(1, 16, false),
            seat(2, 2, true),
            seat(2, 2, true),
        ];
        assert!(takes(&asked));
    }

    #[test]
    fn every_process_of_this_machine_names_it_alike() {
        assert_eq!(
            machine(0),
            machine(5),
            "the boot id, not the launcher's host"
        );
    }
}
