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

use crate::config::Config;
use crate::error::Error;
use crate::kolo::Kolo;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// Which set: its members (world ranks, ascending) and how many sets of
/// the same members this rank made before it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SetLabel {
    pub(crate) members: Vec<usize>,
    pub(crate) ordinal: u32,
}

impl SetLabel {
    /// A world rank for `rank` of the set (itself when out of range: a
    /// message must not fail for it).
    pub(crate) fn world_rank(&self, rank: usize) -> usize {
        self.members.get(rank).copied().unwrap_or(rank)
    }

    /// A short key for backends' message spaces: the members and the
    /// ordinal, the same on every member.
    #[cfg_attr(not(feature = "ucx"), allow(dead_code))]
    pub(crate) fn key(&self) -> String {
        let members: Vec<String> = self.members.iter().map(usize::to_string).collect();
        format!("{}#{}", members.join("."), self.ordinal)
    }
}

impl fmt::Display for SetLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process set {:?}", self.members)?;
        if self.ordinal > 0 {
            write!(f, " (the {} made from these ranks)", nth(self.ordinal + 1))?;
        }
        Ok(())
    }
}

fn nth(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, r) if r != 11 => "st",
        (2, r) if r != 12 => "nd",
        (3, r) if r != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

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

/// What a backend's launcher leaves a world's [`Kolo`] so that it can
/// make sets: starts this rank's engine of the set `label` on a new
/// communicator of its members. Every member calls it with the same label.
pub(crate) trait SetMaker: Send + Sync {
    fn start(&self, label: &SetLabel, config: &Config) -> Result<Kolo, Error>;
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

    #[test]
    fn labels_name_members_and_repeats() {
        let first = SetLabel {
            members: vec![0, 2],
            ordinal: 0,
        };
        assert_eq!(first.to_string(), "process set [0, 2]");
        assert_eq!(first.key(), "0.2#0");
        let third = SetLabel {
            members: vec![0, 2],
            ordinal: 2,
        };
        assert_eq!(
            third.to_string(),
            "process set [0, 2] (the 3rd made from these ranks)"
        );
        assert_eq!(third.world_rank(1), 2);
        assert_eq!(third.world_rank(5), 5);
        assert_eq!(nth(11), "11th");
        assert_eq!(nth(22), "22nd");
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
