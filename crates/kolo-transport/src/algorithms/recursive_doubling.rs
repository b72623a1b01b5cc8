//! Recursive-doubling allreduce (latency-optimal for short buffers): at
//! step `k` every rank swaps its whole partial result with rank
//! `rank ^ 2^k` and folds the peer's into its own, so `log2 p` exchanges
//! reduce over `p` ranks (the ring needs `2 (n - 1)`). Where `n` is not a
//! power of two, the `n - p` ranks past the largest power of two `p` first
//! hand their buffers to rank `rank - p` and receive the result from it at
//! the end.
//!
//! Every rank ends with bitwise the same values: each step combines the same
//! two partial results on both sides, and kolo's ops are commutative
//! element by element.

use super::scratch::with_scratch;
use super::ALLREDUCE_TAG;
use crate::element::Element;
use crate::error::Result;
use crate::traits::{Collectives, Scale};
use kolo_protocol::ReduceOp;

/// The largest power of two not above `n` (`n >= 1`).
fn largest_power_of_two(n: usize) -> usize {
    1usize << (usize::BITS - 1 - n.max(1).leading_zeros())
}

/// What rank `rank` of `n` does: `Fold(peer)` for a rank past the power of
/// two (hands its buffer to `peer` and takes the result back), otherwise
/// `Exchange { extra, peers }`: first fold in `extra`'s buffer (if any),
/// then swap with each of `peers` in turn, then send the result to `extra`.
/// Backends use it for their own recursive-doubling exchanges (kolo-ucx's
/// bitwise allreduce of the control plane).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Hand the buffer to this rank, then take the result back from it.
    Fold(usize),
    /// Fold in `extra`'s buffer first (if any), swap with each of `peers`
    /// in turn, then send the result to `extra`.
    Exchange {
        /// The rank past the power of two this rank folds in.
        extra: Option<usize>,
        /// The partner of each exchange, in order.
        peers: Vec<usize>,
    },
}

/// What rank `rank` of `n` does in a recursive-doubling exchange.
pub fn schedule(rank: usize, n: usize) -> Schedule {
    let p = largest_power_of_two(n);
    if rank >= p {
        return Schedule::Fold(rank - p);
    }
    let extra = (rank + p < n).then_some(rank + p);
    let peers = (0..p.trailing_zeros()).map(|k| rank ^ (1 << k)).collect();
    Schedule::Exchange { extra, peers }
}

/// In place: `buf = postscale' * op_r(prescale * buf_r)` where `postscale'`
/// is [`Scale::postscale_for`], as [`super::ring_allreduce`]. Every rank
/// passes the same length; a rank whose length differs sees messages of the
/// wrong length (an `InvalidArgument` from `recv`).
pub fn recursive_doubling_allreduce<C: Collectives + ?Sized, T: Element>(
    comm: &mut C,
    buf: &mut [T],
    op: ReduceOp,
    scale: Scale,
) -> Result<()> {
    let (n, rank) = (comm.size(), comm.rank());
    T::scale(buf, scale.prescale);
    match schedule(rank, n) {
        Schedule::Fold(peer) => {
            comm.send(buf, peer, ALLREDUCE_TAG)?;
            comm.recv(buf, peer, ALLREDUCE_TAG)
        }
        Schedule::Exchange { extra, peers } => {
            let len = if n > 1 { buf.len() } else { 0 };
            with_scratch(len, |incoming: &mut [T]| {
                if let Some(extra) = extra {
                    comm.recv(incoming, extra, ALLREDUCE_TAG)?;
                    T::reduce_into(buf, incoming, op);
                }
                for &peer in &peers {
                    comm.sendrecv(buf, peer, incoming, peer, ALLREDUCE_TAG)?;
                    T::reduce_into(buf, incoming, op);
                }
                Ok(())
            })?;
            T::scale(buf, scale.postscale_for(op, n));
            match extra {
                Some(extra) => comm.send(buf, extra, ALLREDUCE_TAG),
                None => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs the schedule on sets of contributors (bit r = rank r): every
    /// rank must end with each contribution exactly once, and both sides
    /// of every exchange must hold the same set before it.
    fn simulate(n: usize) -> Result<(), TestCaseError> {
        let schedules: Vec<Schedule> = (0..n).map(|r| schedule(r, n)).collect();
        let mut state: Vec<u64> = (0..n).map(|r| 1u64 << r).collect();
        for (r, s) in schedules.iter().enumerate() {
            if let Schedule::Exchange { extra: Some(e), .. } = s {
                prop_assert_eq!(&schedules[*e], &Schedule::Fold(r));
                state[r] |= state[*e];
            }
        }
        let p = largest_power_of_two(n);
        for k in 0..p.trailing_zeros() as usize {
            let before = state.clone();
            for r in 0..p {
                let Schedule::Exchange { peers, .. } = &schedules[r] else {
                    return Err(TestCaseError::fail(format!("rank {r} < {p} folds")));
                };
                let peer = peers[k];
                let Schedule::Exchange { peers: theirs, .. } = &schedules[peer] else {
                    return Err(TestCaseError::fail(format!("peer {peer} folds")));
                };
                prop_assert_eq!(theirs[k], r, "exchanges pair up");
                prop_assert_eq!(before[r] & before[peer], 0, "counted twice");
                state[r] = before[r] | before[peer];
            }
        }
        for (r, s) in schedules.iter().enumerate() {
            if let Schedule::Fold(peer) = s {
                state[r] = state[*peer];
            }
        }
        let everyone = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        for (r, have) in state.iter().enumerate() {
            prop_assert_eq!(*have, everyone, "rank {} misses contributions", r);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn schedule_reduces_everything_once(n in 1usize..=64) {
            simulate(n)?;
        }
    }

    #[test]
    fn powers_of_two() {
        assert_eq!(largest_power_of_two(1), 1);
        assert_eq!(largest_power_of_two(2), 2);
        assert_eq!(largest_power_of_two(3), 2);
        assert_eq!(largest_power_of_two(64), 64);
        assert_eq!(largest_power_of_two(65), 64);
    }
}
