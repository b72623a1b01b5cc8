//! Which process set an engine is of: its members and how many sets of
//! the same members came before it. A leaf of the crate: errors, the
//! engine and the API name sets by it.

use std::fmt;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
