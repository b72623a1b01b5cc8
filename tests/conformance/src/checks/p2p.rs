//! Point-to-point messages and barriers.

use crate::failure::{agree, check, transport, Failure};
use crate::reference::{check_inputs, Inputs};
use crate::values::{inputs, salt_of, Values};
use kolo_transport::{Collectives, Controller, Element};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The tags in the order they are sent; they are received as 1, 2, 3.
const TAGS_SENT: [u32; 3] = [3, 1, 2];
/// Messages per (peer, tag).
const ROUNDS: usize = 3;

/// Where the message `round` with `tag` for `dst` starts in the sender's
/// input space.
fn message_start(dst: usize, tag: u32, round: usize) -> u64 {
    ((dst as u64) << 40) | (u64::from(tag) << 32) | ((round as u64) << 24)
}

/// Every rank sends every other rank three rounds of messages on tags 3, 1
/// and 2 (in that order, lengths `count`, `count + 1`, `count + 2`), then
/// receives them tag by tag, peers in reverse order: checks that messages
/// are matched by (peer, tag) and keep their order per (peer, tag). Needs
/// sends that complete before the receiver posts a receive (buffered /
/// eager sends); see [`crate::SuiteOptions::unordered_p2p`].
pub fn check_send_recv<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    count: usize,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!(
        "send_recv dtype={} count={count} tags=3,1,2 rounds={ROUNDS} size={n}",
        T::DTYPE
    );
    let salt = salt_of(&case);
    let peers: Vec<usize> = (0..n).filter(|&p| p != rank).collect();
    for round in 0..ROUNDS {
        for tag in TAGS_SENT {
            for &peer in &peers {
                let start = message_start(peer, tag, round);
                let msg = inputs::<T>(count + round, Values::General, salt, rank, start);
                comm.send(&msg, peer, tag).map_err(transport(&case, rank))?;
            }
        }
    }
    let mut local = Ok(());
    for tag in [1, 2, 3] {
        for round in 0..ROUNDS {
            for &peer in peers.iter().rev() {
                let mut buf = vec![T::default(); count + round];
                comm.recv(&mut buf, peer, tag)
                    .map_err(transport(&case, rank))?;
                let start = message_start(rank, tag, round);
                let sent = Inputs {
                    values: Values::General,
                    salt,
                    rank: peer,
                    start,
                };
                local = local.and_then(|()| check_inputs(&case, rank, 0, &buf, sent));
            }
        }
    }
    agree(comm, &case, local)
}

/// A ring shift with `sendrecv`: every rank sends `count` elements to its
/// right neighbour and receives its left neighbour's (nothing for 1 rank).
pub fn check_sendrecv<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    count: usize,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("sendrecv dtype={} count={count} size={n}", T::DTYPE);
    let mut local = Ok(());
    if n > 1 {
        let salt = salt_of(&case);
        let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
        let send = inputs::<T>(count, Values::General, salt, rank, 0);
        let mut recv = vec![T::default(); count];
        comm.sendrecv(&send, right, &mut recv, left, 9)
            .map_err(transport(&case, rank))?;
        let sent = Inputs {
            values: Values::General,
            salt,
            rank: left,
            start: 0,
        };
        local = check_inputs(&case, rank, 0, &recv, sent);
    }
    agree(comm, &case, local)
}

/// `rounds` barriers, each with a message sent to the right neighbour
/// before it and received after it: a barrier must neither lose nor
/// consume user messages.
pub fn check_barrier<C: Collectives + Controller>(
    comm: &mut C,
    rounds: usize,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("barrier rounds={rounds} size={n}");
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut local = Ok(());
    for round in 0..rounds as i32 {
        if n > 1 {
            comm.send(&[round], right, 11)
                .map_err(transport(&case, rank))?;
        }
        comm.barrier().map_err(transport(&case, rank))?;
        if n > 1 {
            let mut got = [-1i32];
            comm.recv(&mut got, left, 11)
                .map_err(transport(&case, rank))?;
            if got[0] != round && local.is_ok() {
                local = Err(check(
                    &case,
                    rank,
                    format!("round {round}: received round {} after the barrier", got[0]),
                ));
            }
        }
    }
    agree(comm, &case, local)
}

/// For backends whose ranks share a process: every rank increments
/// `arrivals` (shared by exactly the ranks of `comm`, starting at 0) before
/// each of `rounds` barriers and checks after it that all `size` ranks of
/// that round have arrived: a barrier that lets a rank through early fails.
pub fn check_barrier_counter<C: Collectives + Controller>(
    comm: &mut C,
    arrivals: &AtomicUsize,
    rounds: usize,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("barrier (shared arrival counter) rounds={rounds} size={n}");
    let mut local = Ok(());
    for round in 0..rounds {
        arrivals.fetch_add(1, Ordering::SeqCst);
        comm.barrier().map_err(transport(&case, rank))?;
        let seen = arrivals.load(Ordering::SeqCst);
        let want = n * (round + 1);
        if seen < want && local.is_ok() {
            local = Err(check(
                &case,
                rank,
                format!("left barrier {round} after {seen} arrivals, expected at least {want}"),
            ));
        }
    }
    agree(comm, &case, local)
}
