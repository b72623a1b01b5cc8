//! The control plane of [`UcxComm`]: kolo-transport's `Controller` as
//! probed messages of any length, on tags of their own (each ordered per
//! pair of ranks, and every rank makes the same control calls in the same
//! order).

use crate::bitwise::Bitwise;
use crate::comm::UcxComm;
use crate::result;
use crate::safe::wait::{InFlight, WaitError};
use crate::safe::worker::plain_params;
use crate::tags::{self, Plane, FULL_MASK};
use kolo_transport::algorithms::recursive_doubling::{self, Schedule};
use kolo_transport::{BitOp, Controller, Result, TransportError};

const GATHER: u32 = 1;
const BROADCAST: u32 = 2;
const BITWISE: u32 = 3;

impl UcxComm {
    /// The tag of a bitwise allreduce's message from `source`.
    fn bitwise_tag(&self, source: usize) -> u64 {
        tags::tag(source, BITWISE, Plane::Control)
    }

    /// Sends `bytes` to `peer` and receives its message of any length, at
    /// the same time (neither side waits for the other's receive first).
    fn exchange_any(&mut self, bytes: &[u8], peer: usize) -> Result<Vec<u8>> {
        let send = self.start_send(bytes, peer, self.bitwise_tag(self.rank))?;
        let received = self.recv_any(peer, self.bitwise_tag(peer));
        let mut requests = [send];
        let sent = self.wait(&mut requests, peer, "a bitwise allreduce");
        let received = received?;
        sent.map(|()| received)
    }

    /// Receives a control message of any length from `peer`.
    pub(crate) fn recv_any(&mut self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        let what = "a control message";
        let mut idle = 0u32;
        loop {
            // SAFETY: the worker is live; a probed message is received
            // right below.
            if let Some((message, len)) =
                unsafe { result::tag_probe(self.worker.raw(), tag, FULL_MASK) }
            {
                let mut bytes = vec![0u8; len];
                let params = plain_params();
                let ptr = if len == 0 {
                    std::ptr::null_mut()
                } else {
                    bytes.as_mut_ptr().cast()
                };
                // SAFETY: `bytes` holds the message's length and stays
                // borrowed until the request completed below.
                let started =
                    unsafe { result::tag_msg_recv(self.worker.raw(), ptr, len, message, &params) }
                        .map_err(|e| TransportError::Backend(e.to_string()))?;
                let mut requests = [InFlight::new(started, true, len, "ucp_tag_msg_recv_nbx")];
                self.wait(&mut requests, peer, what)?;
                return Ok(bytes);
            }
            if let Some(cause) = self.peers.iter().find_map(|p| p.failure()) {
                return Err(self.failed(peer, what, WaitError::PeerFailed(cause)));
            }
            if let Some(why) = self.interrupter.reason() {
                return Err(self.failed(peer, what, WaitError::Interrupted(why)));
            }
            if self.worker.progress() == 0 {
                idle += 1;
                if idle > self.spin_polls {
                    std::thread::yield_now();
                }
            } else {
                idle = 0;
            }
        }
    }
}

impl Controller for UcxComm {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        self.check_peer(root)?;
        if self.rank != root {
            let t = tags::tag(self.rank, GATHER, Plane::Control);
            self.send_bytes(msg, root, t, "a control gather")?;
            return Ok(None);
        }
        let mut all = Vec::with_capacity(self.size);
        for peer in 0..self.size {
            if peer == self.rank {
                all.push(msg.to_vec());
            } else {
                all.push(self.recv_any(peer, tags::tag(peer, GATHER, Plane::Control))?);
            }
        }
        Ok(Some(all))
    }

    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        self.check_peer(root)?;
        if self.rank == root {
            let t = tags::tag(self.rank, BROADCAST, Plane::Control);
            // All at once: the root does not wait for one peer before the
            // next.
            let mut requests = Vec::with_capacity(self.size);
            for peer in (0..self.size).filter(|&p| p != root) {
                requests.push(self.start_send(msg, peer, t)?);
            }
            let first = (0..self.size).find(|&p| p != root).unwrap_or(root);
            self.wait(&mut requests, first, "a control broadcast")?;
            return Ok(msg.to_vec());
        }
        self.recv_any(root, tags::tag(root, BROADCAST, Plane::Control))
    }

    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        let gathered = self.gather_bytes(msg, 0)?;
        let packed = gathered.map(|all| pack(&all)).unwrap_or_default();
        unpack(&self.broadcast_bytes(&packed, 0)?, self.size)
    }

    fn control_barrier(&mut self) -> Result<()> {
        self.allgather_bytes(&[]).map(drop)
    }

    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        let mut state = Bitwise::new(self.rank, words);
        match recursive_doubling::schedule(self.rank, self.size) {
            Schedule::Fold(partner) => {
                self.send_bytes(
                    &state.encode(),
                    partner,
                    self.bitwise_tag(self.rank),
                    "a bitwise allreduce",
                )?;
                let result = self.recv_any(partner, self.bitwise_tag(partner))?;
                state.adopt(partner, &result)?;
            }
            Schedule::Exchange { extra, peers } => {
                if let Some(extra) = extra {
                    let theirs = self.recv_any(extra, self.bitwise_tag(extra))?;
                    state.fold(extra, &theirs, op)?;
                }
                for peer in peers {
                    let theirs = self.exchange_any(&state.encode(), peer)?;
                    state.fold(peer, &theirs, op)?;
                }
                if let Some(extra) = extra {
                    self.send_bytes(
                        &state.encode(),
                        extra,
                        self.bitwise_tag(self.rank),
                        "a bitwise allreduce",
                    )?;
                }
            }
        }
        words.copy_from_slice(&state.finish()?);
        Ok(())
    }
}

/// Messages as one buffer: each length (8 bytes, little-endian), then its
/// bytes.
fn pack(messages: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(messages.iter().map(|m| m.len() + 8).sum());
    for m in messages {
        out.extend_from_slice(&(m.len() as u64).to_le_bytes());
        out.extend_from_slice(m);
    }
    out
}

/// [`pack`]'s messages back, `count` of them.
fn unpack(mut bytes: &[u8], count: usize) -> Result<Vec<Vec<u8>>> {
    let malformed = || TransportError::Backend("a malformed control broadcast".into());
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, rest) = bytes.split_at_checked(8).ok_or_else(malformed)?;
        let len = u64::from_le_bytes(len.try_into().map_err(|_| malformed())?) as usize;
        let (message, rest) = rest.split_at_checked(len).ok_or_else(malformed)?;
        out.push(message.to_vec());
        bytes = rest;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_messages_come_back() {
        let messages = vec![vec![1, 2, 3], vec![], vec![9; 20]];
        assert_eq!(unpack(&pack(&messages), 3).unwrap(), messages);
        assert!(unpack(&pack(&messages)[..5], 3).is_err());
    }
}
