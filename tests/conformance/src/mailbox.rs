//! The smallest correct backend: ranks as threads joined by one unbounded
//! channel per ordered pair of ranks. It implements only `send` / `recv`
//! (so every collective runs kolo-transport's generic algorithms) and a
//! control plane over the same channels. It exists to test this suite (and
//! the generic algorithms) without any real backend, and as an example of
//! implementing the traits; it makes no attempt at speed.

use kolo_protocol::DataType;
use kolo_transport::byte_view::{as_bytes, copy_from_bytes};
use kolo_transport::{
    BitOp, Collectives, Controller, Element, Result, Topology, TransportError, BACKEND_TAG_BASE,
};
use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver, Sender};

const GATHER_TAG: u32 = BACKEND_TAG_BASE;
const BROADCAST_TAG: u32 = BACKEND_TAG_BASE + 1;
const ALLGATHER_TAG: u32 = BACKEND_TAG_BASE + 2;

/// One message: its tag, the dtype of a data-plane message (`None` for the
/// control plane) and its bytes.
#[derive(Debug)]
struct Envelope {
    tag: u32,
    dtype: Option<DataType>,
    bytes: Vec<u8>,
}

/// One rank of a mailbox communicator (see [`mailboxes`]).
#[derive(Debug)]
pub struct MailboxComm {
    rank: usize,
    /// `to[p]`: the channel to rank p.
    to: Vec<Sender<Envelope>>,
    /// `from[p]`: the channel from rank p.
    from: Vec<Receiver<Envelope>>,
    /// Messages from rank p that arrived before a receive for their tag.
    early: Vec<VecDeque<Envelope>>,
}

/// `n` connected ranks, to be moved to one thread each. A rank that drops
/// its communicator (returns or panics) makes its peers' pending and later
/// receives from it fail with `PeerFailed`.
pub fn mailboxes(n: usize) -> Vec<MailboxComm> {
    let mut to: Vec<Vec<Sender<Envelope>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
    let mut from: Vec<Vec<Receiver<Envelope>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
    for senders in to.iter_mut() {
        for receivers in from.iter_mut() {
            let (tx, rx) = channel();
            senders.push(tx);
            receivers.push(rx);
        }
    }
    to.into_iter()
        .zip(from)
        .enumerate()
        .map(|(rank, (to, from))| MailboxComm {
            rank,
            to,
            from,
            early: (0..n).map(|_| VecDeque::new()).collect(),
        })
        .collect()
}

/// Runs `f` on `n` ranks, one scoped thread each, and returns their results
/// in rank order. A panicking rank's panic is re-raised here after every
/// rank has finished (its peers see `PeerFailed` rather than hanging).
pub fn run<R: Send, F: Fn(&mut MailboxComm) -> R + Sync>(n: usize, f: F) -> Vec<R> {
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = mailboxes(n)
            .into_iter()
            .map(|mut comm| scope.spawn(move || f(&mut comm)))
            .collect();
        let joined: Vec<std::thread::Result<R>> = handles.into_iter().map(|h| h.join()).collect();
        joined
            .into_iter()
            .map(|r| r.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    })
}

impl MailboxComm {
    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer < self.to.len() {
            Ok(())
        } else {
            Err(TransportError::InvalidArgument(format!(
                "peer {peer} is out of range for a communicator of {} ranks",
                self.to.len()
            )))
        }
    }

    fn post(&self, peer: usize, tag: u32, dtype: Option<DataType>, bytes: Vec<u8>) -> Result<()> {
        self.check_peer(peer)?;
        self.to[peer]
            .send(Envelope { tag, dtype, bytes })
            .map_err(|_| peer_gone(peer))
    }

    fn take(&mut self, peer: usize, tag: u32) -> Result<Envelope> {
        self.check_peer(peer)?;
        if let Some(at) = self.early[peer].iter().position(|e| e.tag == tag) {
            if let Some(envelope) = self.early[peer].remove(at) {
                return Ok(envelope);
            }
        }
        loop {
            let envelope = self.from[peer].recv().map_err(|_| peer_gone(peer))?;
            if envelope.tag == tag {
                return Ok(envelope);
            }
            self.early[peer].push_back(envelope);
        }
    }
}

fn peer_gone(peer: usize) -> TransportError {
    TransportError::PeerFailed {
        rank: peer,
        message: "dropped its communicator (returned or panicked)".into(),
    }
}

impl Topology for MailboxComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.to.len()
    }
    fn local_rank(&self) -> usize {
        self.rank
    }
    fn local_size(&self) -> usize {
        self.to.len()
    }
}

impl Collectives for MailboxComm {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.post(peer, tag, Some(T::DTYPE), as_bytes(buf).to_vec())
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        let envelope = self.take(peer, tag)?;
        if envelope.dtype != Some(T::DTYPE) {
            return Err(TransportError::InvalidArgument(format!(
                "rank {peer} sent {:?} with tag {tag}, received as {}",
                envelope.dtype,
                T::DTYPE
            )));
        }
        copy_from_bytes(buf, &envelope.bytes)
    }
}

impl Controller for MailboxComm {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        self.check_peer(root)?;
        if self.rank != root {
            self.post(root, GATHER_TAG, None, msg.to_vec())?;
            return Ok(None);
        }
        let mut all = Vec::with_capacity(self.size());
        for peer in 0..self.size() {
            all.push(if peer == root {
                msg.to_vec()
            } else {
                self.take(peer, GATHER_TAG)?.bytes
            });
        }
        Ok(Some(all))
    }

    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        self.check_peer(root)?;
        if self.rank != root {
            return Ok(self.take(root, BROADCAST_TAG)?.bytes);
        }
        for peer in (0..self.size()).filter(|&p| p != root) {
            self.post(peer, BROADCAST_TAG, None, msg.to_vec())?;
        }
        Ok(msg.to_vec())
    }

    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        for peer in (0..self.size()).filter(|&p| p != self.rank) {
            self.post(peer, ALLGATHER_TAG, None, msg.to_vec())?;
        }
        let mut all = Vec::with_capacity(self.size());
        for peer in 0..self.size() {
            all.push(if peer == self.rank {
                msg.to_vec()
            } else {
                self.take(peer, ALLGATHER_TAG)?.bytes
            });
        }
        Ok(all)
    }

    fn control_barrier(&mut self) -> Result<()> {
        self.allgather_bytes(&[]).map(drop)
    }

    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let all = self.allgather_bytes(&bytes)?;
        for (peer, theirs) in all.iter().enumerate() {
            if theirs.len() != bytes.len() {
                return Err(TransportError::InvalidArgument(format!(
                    "bitwise_allreduce: rank {peer} passed {} words, rank {} passed {}",
                    theirs.len() / 8,
                    self.rank,
                    words.len()
                )));
            }
            for (w, t) in words.iter_mut().zip(theirs.chunks_exact(8)) {
                let t = u64::from_le_bytes([t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]]);
                *w = match op {
                    BitOp::And => *w & t,
                    BitOp::Or => *w | t,
                };
            }
        }
        Ok(())
    }
}
