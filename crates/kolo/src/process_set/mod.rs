//! Process sets (Horovod's `ProcessSet`, torch.distributed's `new_group`):
//! a subset of the world's ranks with an engine of its own.
//!
//! A set is made by its members only, each passing the same list of world
//! ranks; ranks outside it call nothing. Each member gets a
//! [`ProcessSet`], which dereferences to a [`Kolo`] over the set's own
//! communicator: every collective, [`TensorGroup`](crate::TensorGroup)
//! and handle works on it as on the world, with ranks numbered within
//! the set (set rank `i` is world rank `members()[i]`). Because the set
//! has its own engine, it negotiates, caches responses, fuses and
//! inspects stalls on its own: a tensor name used in two sets (or in a
//! set and the world) at once names two different tensors, and a set
//! waiting on a late member never holds up another set.
//!
//! The members of one list must make its sets in the same order; the
//! n-th set made from a list on one rank meets the n-th made from it on
//! the others. Backends make the set's communicator from members alone:
//! kolo-threads a world of the member threads, UCX endpoints exchanged
//! through the rendezvous store, MPI `MPI_Comm_create_group`.

#[cfg(feature = "mpi")]
pub(crate) mod mpi;
pub(crate) mod threads;
#[cfg(feature = "ucx")]
pub(crate) mod ucx;

use crate::error::Error;
use crate::kolo::Kolo;
use crate::set_label::SetLabel;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// The members of a set `me` makes in a world of `world` ranks, sorted:
/// every rank in range, none twice, `me` among them.
pub(crate) fn check_members(
    members: &[usize],
    world: usize,
    me: usize,
) -> Result<Vec<usize>, Error> {
    let refuse = |reason: String| Error::ProcessSet {
        members: members.to_vec(),
        reason,
    };
    if members.is_empty() {
        return Err(refuse("a process set needs at least one rank".into()));
    }
    let mut sorted = members.to_vec();
    sorted.sort_unstable();
    if let Some(&out) = sorted.iter().find(|&&r| r >= world) {
        return Err(refuse(format!(
            "rank {out} is out of range: the world has {world} ranks (0..{world})"
        )));
    }
    if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(refuse(format!("rank {} is listed twice", pair[0])));
    }
    if sorted.binary_search(&me).is_err() {
        return Err(refuse(format!(
            "rank {me} is not a member: only the members of a set make it"
        )));
    }
    Ok(sorted)
}

impl Kolo {
    /// Makes a process set of `members` (world ranks, in any order): the
    /// returned [`ProcessSet`] is a `Kolo` of its own over those ranks
    /// (see [`crate::ProcessSet`] for what it shares with the world: nothing
    /// but the processes). Only the members call it, each with the same
    /// ranks; it returns once every member did. The members of one list
    /// make its sets in the same order.
    ///
    /// Fails with [`Error::ProcessSet`] naming the members for a rank out
    /// of range or listed twice, a caller outside the set, a set of a
    /// set, and a backend that cannot make sets (NCCL's engines); and
    /// after the operation timeout ([`Config::timeout`]) when some member
    /// never calls it.
    pub fn process_set(&self, members: &[usize]) -> Result<ProcessSet, Error> {
        let refuse = |reason: &str| Error::ProcessSet {
            members: members.to_vec(),
            reason: reason.to_owned(),
        };
        if self.process_set_label().is_some() {
            return Err(refuse(
                "this is a process set's engine: make sets from the world's, with world ranks",
            ));
        }
        let sorted = check_members(members, self.size(), self.rank())?;
        let Some(maker) = self.set_maker() else {
            return Err(refuse("this backend cannot make process sets"));
        };
        let ordinal = self.next_set_ordinal(&sorted);
        let label = Arc::new(SetLabel {
            members: sorted,
            ordinal,
        });
        let kolo = maker.start(&label, self.config()).map_err(|e| match e {
            Error::ProcessSet { .. } => e,
            other => Error::ProcessSet {
                members: label.members.clone(),
                reason: other.to_string(),
            },
        })?;
        Ok(ProcessSet::new(kolo.of_set(Arc::clone(&label)), label))
    }
}

/// One member's handle on a process set: a [`Kolo`] over the set's own
/// communicator (it dereferences to it), with ranks numbered within the
/// set. Errors of its operations name the set and its world ranks.
///
/// Dropping it shuts the set's engine down, on every member (as dropping
/// a world's `Kolo` does); the world is unaffected.
///
/// ```
/// use kolo::{Config, ReduceOp};
/// let sums = kolo::threads::run(4, Config::default(), |kolo| {
///     // Ranks 0 and 2 make a set; ranks 1 and 3 another.
///     let members = if kolo.rank() % 2 == 0 { [0, 2] } else { [1, 3] };
///     let set = kolo.process_set(&members)?;
///     let mut x = [kolo.rank() as i32];
///     // The same name in both sets: two different tensors.
///     set.allreduce("x", &mut x, ReduceOp::Sum)?;
///     Ok((set.rank(), set.size(), x[0]))
/// })?;
/// assert_eq!(sums, [(0, 2, 2), (0, 2, 4), (1, 2, 2), (1, 2, 4)]);
/// # Ok::<(), kolo::Error>(())
/// ```
pub struct ProcessSet {
    kolo: Kolo,
    label: Arc<SetLabel>,
}

impl ProcessSet {
    pub(crate) fn new(kolo: Kolo, label: Arc<SetLabel>) -> ProcessSet {
        ProcessSet { kolo, label }
    }

    /// The members, as world ranks in ascending order: set rank `i` is
    /// world rank `members()[i]`.
    pub fn members(&self) -> &[usize] {
        &self.label.members
    }

    /// The world rank of the set's rank `rank`.
    pub fn world_rank(&self, rank: usize) -> Option<usize> {
        self.label.members.get(rank).copied()
    }

    /// The set's engine.
    pub fn kolo(&self) -> &Kolo {
        &self.kolo
    }
}

impl Deref for ProcessSet {
    type Target = Kolo;

    fn deref(&self) -> &Kolo {
        &self.kolo
    }
}

impl fmt::Debug for ProcessSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessSet")
            .field("members", &self.label.members)
            .field("ordinal", &self.label.ordinal)
            .field("rank", &self.kolo.rank())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn members_are_sorted_and_checked_naming_the_values() {
        assert_eq!(check_members(&[3, 0, 2], 4, 2).unwrap(), [0, 2, 3]);
        let message =
            |members: &[usize], me| check_members(members, 4, me).unwrap_err().to_string();
        assert!(message(&[], 0).contains("at least one rank"));
        assert!(message(&[0, 4], 0).contains("rank 4 is out of range: the world has 4 ranks"));
        assert!(message(&[1, 0, 1], 0).contains("rank 1 is listed twice"));
        let outsider = message(&[0, 1], 3);
        assert!(outsider.contains("rank 3 is not a member"), "{outsider}");
        assert!(outsider.contains("[0, 1]"), "{outsider}");
    }

    proptest! {
        #[test]
        fn accepted_members_are_exactly_the_valid_lists(
            members in proptest::collection::vec(0usize..10, 0..8),
            world in 1usize..10,
            me in 0usize..10,
        ) {
            let valid = !members.is_empty()
                && members.iter().all(|&r| r < world)
                && {
                    let mut s = members.clone();
                    s.sort_unstable();
                    s.dedup();
                    s.len() == members.len()
                }
                && members.contains(&me);
            match check_members(&members, world, me) {
                Ok(sorted) => {
                    prop_assert!(valid);
                    prop_assert!(sorted.windows(2).all(|w| w[0] < w[1]));
                    prop_assert_eq!(sorted.len(), members.len());
                }
                Err(e) => {
                    prop_assert!(!valid);
                    let is_set_error = matches!(e, Error::ProcessSet { .. });
                    prop_assert!(is_set_error);
                }
            }
        }
    }
}
