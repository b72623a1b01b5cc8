//! How kolo's messages are told apart in UCX's 64-bit tag: the sender's
//! rank in the top 24 bits, kolo's own 32-bit tag below it, and the plane
//! (data or control) in the lowest 8. A receive matches all 64 bits, so a
//! message from one peer with one tag can only meet a receive posted for
//! exactly that peer and tag — and UCX keeps such messages in order.

/// The most ranks a UCX communicator holds (24 bits of the tag).
pub const MAX_RANKS: usize = 1 << 24;

/// Every bit of the tag matters.
pub const FULL_MASK: u64 = u64::MAX;

/// Which plane a message belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    /// The collectives' data.
    Data = 0,
    /// The control plane's byte messages.
    Control = 1,
}

/// The UCX tag of a message from `source` with kolo's `tag` on `plane`.
pub fn tag(source: usize, tag: u32, plane: Plane) -> u64 {
    debug_assert!(source < MAX_RANKS);
    ((source as u64) << 40) | (u64::from(tag) << 8) | plane as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_do_not_overlap() {
        let a = tag(MAX_RANKS - 1, u32::MAX, Plane::Control);
        assert_eq!(a >> 40, (MAX_RANKS - 1) as u64);
        assert_eq!((a >> 8) & 0xffff_ffff, u32::MAX as u64);
        assert_eq!(a & 0xff, 1);
        assert_ne!(tag(1, 0, Plane::Data), tag(0, 1 << 24, Plane::Data));
        assert_ne!(tag(2, 7, Plane::Data), tag(2, 7, Plane::Control));
    }
}
