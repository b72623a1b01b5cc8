//! The response cache's least-recently-used order: a doubly linked list
//! threaded through the cache slots, grown with the slots in use (never
//! sized by the capacity), so that touching and evicting are O(1).

/// "No slot": the end of the list in either direction.
const END: usize = usize::MAX;

/// Links of the least-recently-used list, through the slots.
#[derive(Clone, Debug)]
pub(crate) struct Lru {
    prev: Vec<usize>,
    next: Vec<usize>,
    /// The least recently used linked slot (`END`: none).
    head: usize,
    /// The most recently used linked slot (`END`: none).
    tail: usize,
    /// Bumped by every change of the order.
    changes: u64,
    /// The slots of the last remembered touch, and `changes` right after
    /// it: while the order is unchanged since, those slots are still the
    /// most recently used, in that order.
    touched: (u64, Vec<usize>),
}

impl Default for Lru {
    fn default() -> Self {
        Lru {
            prev: Vec::new(),
            next: Vec::new(),
            head: END,
            tail: END,
            changes: 0,
            touched: (0, Vec::new()),
        }
    }
}

impl Lru {
    /// Makes room for the links of slots `0..slots` (they start unlinked).
    pub(crate) fn grow(&mut self, slots: usize) {
        if self.next.len() < slots {
            self.prev.resize(slots, END);
            self.next.resize(slots, END);
        }
    }

    /// Takes `slot` (linked) out of the list.
    pub(crate) fn unlink(&mut self, slot: usize) {
        self.changes += 1;
        let (p, n) = (self.prev[slot], self.next[slot]);
        match p {
            END => self.head = n,
            p => self.next[p] = n,
        }
        match n {
            END => self.tail = p,
            n => self.prev[n] = p,
        }
        self.prev[slot] = END;
        self.next[slot] = END;
    }

    /// Appends `slot` (unlinked, grown into) as the most recently used.
    pub(crate) fn push_back(&mut self, slot: usize) {
        self.changes += 1;
        let last = self.tail;
        self.prev[slot] = last;
        self.next[slot] = END;
        match last {
            END => self.head = slot,
            last => self.next[last] = slot,
        }
        self.tail = slot;
    }

    /// True when `slots` were the last ones remembered and the order has
    /// not changed since: they are still the most recently used, in order.
    pub(crate) fn touched_last(&self, slots: &[usize]) -> bool {
        self.touched.0 == self.changes && self.touched.1 == slots
    }

    /// Remembers `slots` as the most recently used ones, in order.
    pub(crate) fn remember_touched(&mut self, slots: &[usize]) {
        self.touched.1.clear();
        self.touched.1.extend_from_slice(slots);
        self.touched.0 = self.changes;
    }

    /// True when the most recently used slots are `slots`, oldest first.
    pub(crate) fn ends_with(&self, slots: &[usize]) -> bool {
        let mut at = self.tail;
        for &slot in slots.iter().rev() {
            if at == END || at != slot {
                return false;
            }
            at = self.prev[at];
        }
        true
    }

    /// The least recently used slot for which `eligible` holds.
    pub(crate) fn first_where(&self, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let mut slot = self.head;
        while slot != END {
            if eligible(slot) {
                return Some(slot);
            }
            slot = self.next[slot];
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list, least recently used first.
    fn order(lru: &Lru) -> Vec<usize> {
        let mut out = Vec::new();
        let mut slot = lru.head;
        while slot != END {
            out.push(slot);
            slot = lru.next[slot];
        }
        out
    }

    #[test]
    fn links_grow_with_the_slots() {
        let mut lru = Lru::default();
        assert_eq!(lru.first_where(|_| true), None);
        assert!(lru.ends_with(&[]));
        assert!(!lru.ends_with(&[0]));
        lru.grow(3);
        for slot in [2, 0, 1] {
            lru.push_back(slot);
        }
        assert_eq!(order(&lru), [2, 0, 1]);
        assert!(lru.ends_with(&[0, 1]) && !lru.ends_with(&[2, 1]));
        lru.unlink(2);
        lru.unlink(1);
        assert_eq!(order(&lru), [0]);
        lru.grow(5);
        lru.push_back(4);
        lru.push_back(1);
        assert_eq!(order(&lru), [0, 4, 1]);
        assert_eq!(lru.first_where(|s| s != 0), Some(4));
        assert!(!lru.ends_with(&[3, 0, 4, 1]));
    }
}
