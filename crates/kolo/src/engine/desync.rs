//! The desync report: where each rank stands when kolo stops for a
//! timeout, a stall or a lost peer, in words a user can act on.
//!
//! Each rank numbers its submissions from 1 (a group is one submission);
//! its [`Standing`] is its last completed submission and its pending ones,
//! oldest first. Ranks that can still speak post theirs (see
//! [`crate::engine::watchdog`]); rank 0 puts them side by side in one
//! [`paragraph`]: which ranks wait on which tensor, which have not
//! submitted it, and which did not answer. Plain data and functions: the
//! threads and the store that carry the reports are elsewhere.

use std::fmt::Write;
use std::time::Duration;

/// How many pending submissions a standing lists (it counts them all).
pub(crate) const LISTED: usize = 8;

/// Longest tensor name a standing carries (longer ones are cut, marked).
const NAME_BOUND: usize = 256;

/// One submission of a rank: its sequence number, its first tensor and
/// how long it has waited (since its submission; zero once completed).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Op {
    pub seq: u64,
    pub tensor: String,
    pub waited: Duration,
}

/// Where one rank stands.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Standing {
    pub rank: usize,
    /// Its last completed submission.
    pub last_done: Option<Op>,
    /// Its pending submissions, oldest first, at most [`LISTED`].
    pub pending: Vec<Op>,
    /// How many submissions are pending in all.
    pub pending_total: u64,
}

impl Standing {
    /// The first pending submission, if any.
    pub(crate) fn first_pending(&self) -> Option<&Op> {
        self.pending.first()
    }

    /// One line: `rank 1: last completed op #41 (tensor 'a'); first
    /// pending op #42 (tensor 'b', waiting 301.0 s), 3 pending`.
    pub(crate) fn line(&self) -> String {
        let mut line = format!("rank {}: ", self.rank);
        match &self.last_done {
            Some(op) => {
                let _ = write!(
                    line,
                    "last completed op #{} (tensor '{}')",
                    op.seq, op.tensor
                );
            }
            None => line.push_str("no op completed yet"),
        }
        match self.first_pending() {
            Some(op) => {
                let _ = write!(
                    line,
                    "; first pending op #{} (tensor '{}', waiting {:.1} s), {} pending",
                    op.seq,
                    op.tensor,
                    op.waited.as_secs_f64(),
                    self.pending_total
                );
            }
            None => line.push_str("; nothing pending"),
        }
        line
    }

    /// The standing as bytes (see [`Standing::decode`]).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&(self.rank as u64).to_le_bytes());
        out.extend_from_slice(&self.pending_total.to_le_bytes());
        match &self.last_done {
            Some(op) => {
                out.push(1);
                encode_op(op, &mut out);
            }
            None => out.push(0),
        }
        let listed = self.pending.len().min(LISTED);
        out.push(listed as u8);
        for op in &self.pending[..listed] {
            encode_op(op, &mut out);
        }
        out
    }

    /// A standing from [`Standing::encode`]'s bytes; `None` for anything
    /// else (a report from another version, or damaged).
    pub(crate) fn decode(bytes: &[u8]) -> Option<Standing> {
        let mut reader = Reader(bytes);
        let rank = usize::try_from(reader.u64()?).ok()?;
        let pending_total = reader.u64()?;
        let last_done = match reader.u8()? {
            0 => None,
            1 => Some(reader.op()?),
            _ => return None,
        };
        let listed = usize::from(reader.u8()?);
        if listed > LISTED {
            return None;
        }
        let pending = (0..listed)
            .map(|_| reader.op())
            .collect::<Option<Vec<_>>>()?;
        if !reader.0.is_empty() || (pending.len() as u64) > pending_total {
            return None;
        }
        Some(Standing {
            rank,
            last_done,
            pending,
            pending_total,
        })
    }
}

fn encode_op(op: &Op, out: &mut Vec<u8>) {
    let name = cut(&op.tensor);
    out.extend_from_slice(&op.seq.to_le_bytes());
    let millis = u64::try_from(op.waited.as_millis()).unwrap_or(u64::MAX);
    out.extend_from_slice(&millis.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// `name` cut to [`NAME_BOUND`] bytes at a character boundary.
fn cut(name: &str) -> &str {
    if name.len() <= NAME_BOUND {
        return name;
    }
    let mut end = NAME_BOUND;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Reads a standing's fields, failing on a short or malformed input.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn op(&mut self) -> Option<Op> {
        let seq = self.u64()?;
        let waited = Duration::from_millis(self.u64()?);
        let len = self
            .take(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)?;
        if len > NAME_BOUND {
            return None;
        }
        let tensor = std::str::from_utf8(self.take(len)?).ok()?.to_owned();
        Some(Op {
            seq,
            tensor,
            waited,
        })
    }
}

/// Longest cause a [`Fault`] carries.
const CAUSE_BOUND: usize = 4096;

/// What a rank posts when it stops for a fault: why (its error's text),
/// and where it stands.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Fault {
    /// The rank whose fault this is (a rank that stops because another
    /// posted a fault passes that one's origin and cause on).
    pub origin: usize,
    /// The timeout, when the origin's operation outlived it (its cause is
    /// then an [`crate::Error::Timeout`]'s text).
    pub after: Option<Duration>,
    pub cause: String,
    pub standing: Standing,
}

impl Fault {
    /// The fault as bytes (see [`Fault::decode`]).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut end = self.cause.len().min(CAUSE_BOUND);
        while !self.cause.is_char_boundary(end) {
            end -= 1;
        }
        let mut out = (self.origin as u64).to_le_bytes().to_vec();
        let after = self.after.map_or(u64::MAX, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX - 1)
        });
        out.extend_from_slice(&after.to_le_bytes());
        out.extend_from_slice(&(end as u32).to_le_bytes());
        out.extend_from_slice(&self.cause.as_bytes()[..end]);
        out.extend_from_slice(&self.standing.encode());
        out
    }

    /// A fault from [`Fault::encode`]'s bytes; `None` for anything else.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Fault> {
        let mut reader = Reader(bytes);
        let origin = usize::try_from(reader.u64()?).ok()?;
        let after = match reader.u64()? {
            u64::MAX => None,
            millis => Some(Duration::from_millis(millis)),
        };
        let len = reader
            .take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)?;
        if len > CAUSE_BOUND {
            return None;
        }
        let cause = std::str::from_utf8(reader.take(len)?).ok()?.to_owned();
        Some(Fault {
            origin,
            after,
            cause,
            standing: Standing::decode(reader.0)?,
        })
    }
}

/// Rank 0's paragraph over the standings of ranks `0..standings.len()`
/// (`None`: the rank did not report): the tensor most ranks wait on
/// first, the ranks that wait on it (with their op numbers), the ranks
/// that have not submitted it (with where they stand), and the ranks that
/// did not answer.
pub(crate) fn paragraph(standings: &[Option<Standing>]) -> String {
    let silent: Vec<usize> = (0..standings.len())
        .filter(|&r| standings[r].is_none())
        .collect();
    let reported: Vec<&Standing> = standings.iter().flatten().collect();
    let mut text = String::from("desync report: ");
    match focus(&reported) {
        None => text.push_str("no rank that reported has an operation pending"),
        Some(tensor) => {
            let waiting: Vec<(usize, u64)> = reported
                .iter()
                .filter_map(|s| {
                    s.pending
                        .iter()
                        .find(|op| op.tensor == tensor)
                        .map(|op| (s.rank, op.seq))
                })
                .collect();
            let _ = write!(
                text,
                "{} {} {} on tensor '{tensor}' (op {})",
                ranks_word(waiting.len()),
                list(waiting.iter().map(|(r, _)| *r)),
                if waiting.len() == 1 { "waits" } else { "wait" },
                waiting
                    .iter()
                    .map(|(_, s)| format!("#{s}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
            for standing in reported
                .iter()
                .filter(|s| !waiting.iter().any(|(r, _)| *r == s.rank))
            {
                let unlisted = standing.pending_total > standing.pending.len() as u64;
                let _ = write!(
                    text,
                    "; rank {} is behind: it has not submitted '{tensor}'{} ({})",
                    standing.rank,
                    if unlisted {
                        " among its first pending ops"
                    } else {
                        ""
                    },
                    standing
                        .line()
                        .split_once(": ")
                        .map_or("", |(_, rest)| rest)
                );
            }
        }
    }
    if !silent.is_empty() {
        let _ = write!(
            text,
            "; {} {} did not report (dead, frozen or unreachable)",
            ranks_word(silent.len()),
            list(silent.iter().copied())
        );
    }
    text.push('.');
    text
}

/// The tensor that most reporting ranks wait on first (ties: the lowest
/// rank's), if any rank waits.
fn focus(reported: &[&Standing]) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for standing in reported {
        let Some(first) = standing.first_pending() else {
            continue;
        };
        let count = reported
            .iter()
            .filter(|s| {
                s.first_pending()
                    .is_some_and(|op| op.tensor == first.tensor)
            })
            .count();
        if best.is_none_or(|(most, _)| count > most) {
            best = Some((count, &first.tensor));
        }
    }
    best.map(|(_, tensor)| tensor.to_owned())
}

fn ranks_word(n: usize) -> &'static str {
    if n == 1 {
        "rank"
    } else {
        "ranks"
    }
}

fn list(ranks: impl Iterator<Item = usize>) -> String {
    ranks.map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn op(seq: u64, tensor: &str, secs: u64) -> Op {
        Op {
            seq,
            tensor: tensor.into(),
            waited: Duration::from_secs(secs),
        }
    }

    fn standing(rank: usize, last: Option<Op>, pending: Vec<Op>) -> Standing {
        let pending_total = pending.len() as u64;
        Standing {
            rank,
            last_done: last,
            pending,
            pending_total,
        }
    }

    #[test]
    fn a_line_names_the_last_completed_and_first_pending_ops() {
        let s = standing(
            1,
            Some(op(41, "grad.3", 0)),
            vec![op(42, "grad.4", 301), op(43, "grad.5", 300)],
        );
        assert_eq!(
            s.line(),
            "rank 1: last completed op #41 (tensor 'grad.3'); first pending op #42 \
             (tensor 'grad.4', waiting 301.0 s), 2 pending"
        );
        assert_eq!(
            standing(0, None, vec![]).line(),
            "rank 0: no op completed yet; nothing pending"
        );
    }

    #[test]
    fn the_paragraph_names_who_waits_who_is_behind_and_who_is_silent() {
        let standings = vec![
            Some(standing(
                0,
                Some(op(41, "grad.3", 0)),
                vec![op(42, "grad.4", 5)],
            )),
            Some(standing(
                1,
                Some(op(41, "grad.3", 0)),
                vec![op(42, "grad.4", 5)],
            )),
            Some(standing(2, Some(op(40, "grad.2", 0)), vec![])),
            None,
        ];
        assert_eq!(
            paragraph(&standings),
            "desync report: ranks 0, 1 wait on tensor 'grad.4' (op #42, #42); rank 2 is \
             behind: it has not submitted 'grad.4' (last completed op #40 (tensor \
             'grad.2'); nothing pending); rank 3 did not report (dead, frozen or \
             unreachable)."
        );
    }

    #[test]
    fn the_paragraph_without_pending_work_says_so() {
        assert_eq!(
            paragraph(&[Some(standing(0, None, vec![])), None]),
            "desync report: no rank that reported has an operation pending; rank 1 did \
             not report (dead, frozen or unreachable)."
        );
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        (any::<u64>(), "\\PC{0,40}", 0u64..1 << 40).prop_map(|(seq, tensor, ms)| Op {
            seq,
            tensor,
            waited: Duration::from_millis(ms),
        })
    }

    fn arb_standing() -> impl Strategy<Value = Standing> {
        (
            0usize..1 << 20,
            proptest::option::of(arb_op()),
            proptest::collection::vec(arb_op(), 0..=LISTED),
            0u64..1000,
        )
            .prop_map(|(rank, last_done, pending, more)| Standing {
                rank,
                last_done,
                pending_total: pending.len() as u64 + more,
                pending,
            })
    }

    proptest! {
        #[test]
        fn a_standing_survives_its_encoding(s in arb_standing()) {
            prop_assert_eq!(Standing::decode(&s.encode()), Some(s));
        }

        #[test]
        fn a_fault_survives_its_encoding(
            origin in 0usize..1 << 20,
            after in proptest::option::of(0u64..1 << 40),
            cause in "\\PC{0,100}",
            s in arb_standing(),
        ) {
            let after = after.map(Duration::from_millis);
            let fault = Fault { origin, after, cause, standing: s };
            prop_assert_eq!(Fault::decode(&fault.encode()), Some(fault));
        }

        #[test]
        fn damaged_bytes_decode_to_none_or_a_standing_never_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..200)
        ) {
            let _ = Standing::decode(&bytes);
            let _ = Fault::decode(&bytes);
        }

        #[test]
        fn the_paragraph_mentions_every_rank(
            standings in proptest::collection::vec(proptest::option::of(arb_standing()), 1..6)
        ) {
            let standings: Vec<Option<Standing>> = standings
                .into_iter()
                .enumerate()
                .map(|(rank, s)| s.map(|s| Standing { rank, ..s }))
                .collect();
            let text = paragraph(&standings);
            for (rank, s) in standings.iter().enumerate() {
                let named = text.contains(&format!("rank {rank} "))
                    || text.contains(&format!(" {rank},"))
                    || text.contains(&format!(" {rank} "))
                    || text.contains(&format!(", {rank} "));
                let idle = s.as_ref().is_some_and(|s| s.pending.is_empty())
                    && text.contains("no rank that reported has an operation pending");
                prop_assert!(named || idle, "rank {} missing from {}", rank, text);
            }
        }
    }
}
