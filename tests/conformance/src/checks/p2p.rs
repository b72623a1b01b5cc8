//! Point-to-point messages and barriers.

use crate::buffers::{download, upload, zeroed};
use crate::failure::{agree, check, transport, Failure};
use crate::reference::{check_inputs, Inputs};
use crate::values::{inputs, salt_of, Values};
use kolo_transport::{Collectives, Controller, Element, Host, Memory};
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
    check_send_recv_on::<Host, T, C>(comm, count)
}

/// [`check_send_recv`] on memory `M`.
pub fn check_send_recv_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
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
                let host = inputs::<T>(count + round, Values::General, salt, rank, start);
                let msg = upload::<M, T, C>(comm, &case, rank, &host)?;
                comm.send(M::view(&msg), peer, tag)
                    .map_err(transport(&case, rank))?;
            }
        }
    }
    let mut local = Ok(());
    for tag in [1, 2, 3] {
        for round in 0..ROUNDS {
            for &peer in peers.iter().rev() {
                let mut dev = zeroed::<M, T, C>(comm, &case, rank, count + round)?;
                comm.recv(M::view_mut(&mut dev), peer, tag)
                    .map_err(transport(&case, rank))?;
                let buf = download::<M, T, C>(comm, &case, rank, &dev)?;
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
    check_sendrecv_on::<Host, T, C>(comm, count)
}

/// [`check_sendrecv`] on memory `M`.
pub fn check_sendrecv_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    count: usize,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("sendrecv dtype={} count={count} size={n}", T::DTYPE);
    let mut local = Ok(());
    if n > 1 {
        let salt = salt_of(&case);
        let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
        let host = inputs::<T>(count, Values::General, salt, rank, 0);
        let send = upload::<M, T, C>(comm, &case, rank, &host)?;
        let mut dev = zeroed::<M, T, C>(comm, &case, rank, count)?;
        comm.sendrecv(M::view(&send), right, M::view_mut(&mut dev), left, 9)
            .map_err(transport(&case, rank))?;
        let recv = download::<M, T, C>(comm, &case, rank, &dev)?;
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
    check_barrier_on::<Host, C>(comm, rounds)
}

/// [`check_barrier`] on memory `M`.
pub fn check_barrier_on<M: Memory, C: Collectives<M> + Controller>(
    comm: &mut C,
    rounds: usize,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!("barrier rounds={rounds} size={n}");
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut local = Ok(());
    for round in 0..rounds as i32 {
        if n > 1 {
            let msg = upload::<M, i32, C>(comm, &case, rank, &[round])?;
            comm.send(M::view(&msg), right, 11)
                .map_err(transport(&case, rank))?;
        }
        comm.barrier().map_err(transport(&case, rank))?;
        if n > 1 {
            let mut dev = upload::<M, i32, C>(comm, &case, rank, &[-1])?;
            comm.recv(M::view_mut(&mut dev), left, 11)
                .map_err(transport(&case, rank))?;
            let got = download::<M, i32, C>(comm, &case, rank, &dev)?;
            if got.as_slice() != [round] && local.is_ok() {
                local = Err(check(
                    &case,
                    rank,
                    format!("round {round}: received {got:?} after the barrier"),
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
    check_barrier_counter_on::<Host, C>(comm, arrivals, rounds)
}

/// [`check_barrier_counter`] on memory `M`.
pub fn check_barrier_counter_on<M: Memory, C: Collectives<M> + Controller>(
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
