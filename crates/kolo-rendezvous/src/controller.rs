//! The store as a control plane: [`Rendezvous`] implements kolo-transport's
//! `Controller`, so a backend's bootstrap that needs a few agreements
//! (kolo-nccl's `NcclComm::init`: every rank's device, the NCCL unique id,
//! each step's outcome) runs over the store where no MPI is at hand.
//!
//! Each exchange is a handful of round trips to rank 0's store and leaves
//! its keys there: fit for start-up, not for an engine's every cycle,
//! which needs a backend's own controller (kolo-ucx's, MPI's).

use crate::{Rendezvous, RendezvousError};
use kolo_transport::{BitOp, Controller, Topology, TransportError};

type Result<T> = std::result::Result<T, TransportError>;

fn transport(e: RendezvousError) -> TransportError {
    match e {
        RendezvousError::Timeout { .. } => TransportError::Timeout(e.to_string()),
        other => TransportError::Backend(format!("rendezvous: {other}")),
    }
}

impl Topology for Rendezvous {
    fn rank(&self) -> usize {
        Rendezvous::rank(self)
    }

    fn size(&self) -> usize {
        self.world_size()
    }

    fn local_rank(&self) -> usize {
        Rendezvous::local_rank(self)
    }

    fn local_size(&self) -> usize {
        self.local_world_size()
    }
}

impl Controller for Rendezvous {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        check_root(root, self.world_size())?;
        let all = self.allgather("ctl/gather", msg).map_err(transport)?;
        Ok((Rendezvous::rank(self) == root).then_some(all))
    }

    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        check_root(root, self.world_size())?;
        self.broadcast("ctl/broadcast", root, msg)
            .map_err(transport)
    }

    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.allgather("ctl/allgather", msg).map_err(transport)
    }

    fn control_barrier(&mut self) -> Result<()> {
        self.barrier("ctl/barrier").map_err(transport)
    }

    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        let mine: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let all = self.allgather("ctl/bits", &mine).map_err(transport)?;
        fold_words(words, &all, op)
    }
}

fn check_root(root: usize, size: usize) -> Result<()> {
    if root < size {
        Ok(())
    } else {
        Err(TransportError::InvalidArgument(format!(
            "root {root} is not a rank of a job of {size}"
        )))
    }
}

/// `words` combined with every rank's words (`all`, little-endian bytes in
/// rank order); a rank that passed another length is an error naming it.
fn fold_words(words: &mut [u64], all: &[Vec<u8>], op: BitOp) -> Result<()> {
    for (rank, bytes) in all.iter().enumerate() {
        if bytes.len() != words.len() * 8 {
            return Err(TransportError::InvalidArgument(format!(
                "bitwise_allreduce: rank {rank} passed {} words, this rank {}",
                bytes.len() / 8,
                words.len()
            )));
        }
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let theirs = u64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
            match op {
                BitOp::And => *word &= theirs,
                BitOp::Or => *word |= theirs,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn fold_matches_a_plain_fold(ranks in proptest::collection::vec(proptest::collection::vec(any::<u64>(), 3), 1..5)) {
            for op in [BitOp::And, BitOp::Or] {
                let all: Vec<Vec<u8>> = ranks
                    .iter()
                    .map(|w| w.iter().flat_map(|x| x.to_le_bytes()).collect())
                    .collect();
                let mut words = ranks[0].clone();
                fold_words(&mut words, &all, op).unwrap();
                for (i, word) in words.iter().enumerate() {
                    let want = ranks.iter().map(|r| r[i]).reduce(|a, b| match op {
                        BitOp::And => a & b,
                        BitOp::Or => a | b,
                    });
                    prop_assert_eq!(Some(*word), want);
                }
            }
        }
    }

    #[test]
    fn a_rank_with_other_lengths_is_named() {
        let mut words = [1u64, 2];
        let all = vec![vec![0u8; 16], vec![0u8; 8]];
        let err = fold_words(&mut words, &all, BitOp::Or).unwrap_err();
        assert!(err.to_string().contains("rank 1 passed 1 words"), "{err}");
    }
}
