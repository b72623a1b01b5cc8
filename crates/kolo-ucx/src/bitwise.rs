//! The control plane's bitwise allreduce as recursive doubling (the
//! engine runs one per cycle to agree on its cached responses): `log2 n`
//! exchanges instead of a gather to rank 0 and a broadcast back. Every
//! message carries the sender's words and the first disagreement on their
//! number it knows of, so a rank that passed another length fails every
//! rank with the same kind of error instead of leaving some waiting.
//!
//! Plain data here; `UcxComm::bitwise_allreduce` moves the messages.

use kolo_transport::{BitOp, Result, TransportError};

/// Two ranks that passed different numbers of words: `(rank, words)` each,
/// the lower rank first.
pub(crate) type Disagreement = ((u64, u64), (u64, u64));

/// One rank's state in the exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bitwise {
    pub rank: usize,
    pub words: Vec<u64>,
    /// The lowest disagreement seen so far (directly or from a peer).
    pub disagreement: Option<Disagreement>,
}

/// Words before the payload: a flag and the disagreement's four numbers.
const HEADER: usize = 5;

impl Bitwise {
    pub(crate) fn new(rank: usize, words: &[u64]) -> Bitwise {
        Bitwise {
            rank,
            words: words.to_vec(),
            disagreement: None,
        }
    }

    /// The message this rank sends: header, then its words.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let ((a, la), (b, lb)) = self.disagreement.unwrap_or_default();
        let flag = u64::from(self.disagreement.is_some());
        [flag, a, la, b, lb]
            .iter()
            .chain(&self.words)
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }

    /// Folds in `peer`'s message: its disagreement, and its words where
    /// their number matches (otherwise a new disagreement).
    pub(crate) fn fold(&mut self, peer: usize, message: &[u8], op: BitOp) -> Result<()> {
        let theirs = self.take_header(peer, message)?;
        if theirs.len() == self.words.len() {
            for (mine, theirs) in self.words.iter_mut().zip(&theirs) {
                match op {
                    BitOp::And => *mine &= theirs,
                    BitOp::Or => *mine |= theirs,
                }
            }
        }
        Ok(())
    }

    /// Takes `peer`'s whole result (a rank past the power of two).
    pub(crate) fn adopt(&mut self, peer: usize, message: &[u8]) -> Result<()> {
        let theirs = self.take_header(peer, message)?;
        if theirs.len() == self.words.len() {
            self.words = theirs;
        }
        Ok(())
    }

    /// Notes the disagreement `peer`'s message carries, and one of its own
    /// if its number of words differs from ours; returns its words.
    fn take_header(&mut self, peer: usize, message: &[u8]) -> Result<Vec<u64>> {
        if message.len() % 8 != 0 || message.len() < HEADER * 8 {
            return Err(TransportError::Backend(format!(
                "bitwise allreduce: rank {peer} sent {} bytes, not a header and whole words",
                message.len()
            )));
        }
        let mut words = message
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
        let mut next = || words.next().unwrap_or_default();
        let (flag, a, la, b, lb) = (next(), next(), next(), next(), next());
        let theirs: Vec<u64> = words.collect();
        if flag != 0 {
            self.note(((a, la), (b, lb)));
        }
        if theirs.len() != self.words.len() {
            let me = (self.rank as u64, self.words.len() as u64);
            let them = (peer as u64, theirs.len() as u64);
            self.note(if me < them { (me, them) } else { (them, me) });
        }
        Ok(theirs)
    }

    fn note(&mut self, d: Disagreement) {
        self.disagreement = Some(self.disagreement.map_or(d, |old| old.min(d)));
    }

    /// The words, or the disagreement as an error naming both ranks.
    pub(crate) fn finish(self) -> Result<Vec<u64>> {
        match self.disagreement {
            None => Ok(self.words),
            Some(((a, la), (b, lb))) => Err(TransportError::InvalidArgument(format!(
                "bitwise allreduce: rank {a} passed {la} words, rank {b} passed {lb} words"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_transport::algorithms::recursive_doubling::{schedule, Schedule};
    use proptest::prelude::*;

    /// Runs the whole exchange among `lens.len()` ranks in memory, rank r
    /// passing `lens[r]` words of `r + 1` shifted by the word's index.
    fn simulate(lens: &[usize], op: BitOp) -> Result<Vec<Result<Vec<u64>>>> {
        let n = lens.len();
        let mut ranks: Vec<Bitwise> = (0..n)
            .map(|r| {
                let words: Vec<u64> = (0..lens[r]).map(|i| ((r as u64) + 1) << (i % 60)).collect();
                Bitwise::new(r, &words)
            })
            .collect();
        let schedules: Vec<Schedule> = (0..n).map(|r| schedule(r, n)).collect();
        for r in 0..n {
            if let Schedule::Exchange { extra: Some(e), .. } = &schedules[r] {
                let message = ranks[*e].encode();
                ranks[r].fold(*e, &message, op)?;
            }
        }
        let steps = schedules
            .iter()
            .map(|s| match s {
                Schedule::Exchange { peers, .. } => peers.len(),
                Schedule::Fold(_) => 0,
            })
            .max()
            .unwrap_or(0);
        for k in 0..steps {
            let messages: Vec<Vec<u8>> = ranks.iter().map(Bitwise::encode).collect();
            for r in 0..n {
                if let Schedule::Exchange { peers, .. } = &schedules[r] {
                    ranks[r].fold(peers[k], &messages[peers[k]], op)?;
                }
            }
        }
        for r in 0..n {
            if let Schedule::Fold(partner) = schedules[r] {
                let message = ranks[partner].encode();
                ranks[r].adopt(partner, &message)?;
            }
        }
        Ok(ranks.into_iter().map(Bitwise::finish).collect())
    }

    proptest! {
        /// Equal lengths: every rank ends with the reduction over all.
        #[test]
        fn equal_lengths_reduce(n in 1usize..=12, len in 0usize..5, or in any::<bool>()) {
            let op = if or { BitOp::Or } else { BitOp::And };
            let results = simulate(&vec![len; n], op).unwrap();
            let want: Vec<u64> = (0..len)
                .map(|i| {
                    let all = (0..n as u64).map(|r| (r + 1) << (i % 60));
                    if or { all.fold(0, |a, b| a | b) } else { all.fold(u64::MAX, |a, b| a & b) }
                })
                .collect();
            for result in results {
                prop_assert_eq!(result.unwrap(), want.clone());
            }
        }

        /// One rank passing another length fails every rank, each naming
        /// two ranks whose lengths differ.
        #[test]
        fn a_different_length_fails_everyone(n in 2usize..=12, odd in 0usize..12, len in 0usize..4) {
            let odd = odd % n;
            let mut lens = vec![len; n];
            lens[odd] = len + 1;
            for result in simulate(&lens, BitOp::Or).unwrap() {
                let err = result.unwrap_err().to_string();
                prop_assert!(err.contains(&format!("rank {odd} passed {} words", len + 1)), "{}", err);
                prop_assert!(err.contains(&format!("passed {len} words")), "{}", err);
            }
        }
    }
}
