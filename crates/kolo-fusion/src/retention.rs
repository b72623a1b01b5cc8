//! Which persistent fusion buffers are kept: a pure ledger of slots and
//! their sizes that decides what to free, so that the buffers together
//! stay within a byte budget and none stays much larger than recent use
//! needs.
//!
//! [`FusionBuffers`](crate::FusionBuffers) is the shell around it: it owns
//! the allocations, asks [`Retention::request`] what to free before it
//! allocates, and reports what it allocated with [`Retention::admit`]. The
//! ledger counts requests, not time, so the same requests always give the
//! same decisions.
//!
//! Two rules, each for a workload the other misses:
//!
//! - **Budget.** Allocating past the budget first frees the least recently
//!   used other slots. Every dtype a job mixes (fp16 and fp32 gradients)
//!   keeps its buffer while they fit together. One request larger than
//!   the whole budget is still served: its slot is then the only one.
//! - **Trim.** Every [`TRIM_WINDOW`] requests, or every [`TRIM_TICKS`]
//!   ticks of its shell's owner (an engine ticks once a cycle) for slots
//!   requested rarely, a slot holding more than
//!   one and a half times the largest request it served in that window is
//!   freed (one not used at all, always), so that a rare large or
//!   rarely used buffer does not stay for the life of the process: what
//!   the slots hold follows the last window's largest requests, not the
//!   largest ever (a soak of random sizes otherwise climbed in steps,
//!   each rare large request raising a slot that later, smaller ones kept
//!   alive). A training step that repeats its requests serves each slot
//!   at its full size every window, and keeps it; a slot trimmed comes
//!   back at the size next asked, at most one allocation per window.

/// Requests (to all slots together) per trim window. Long enough that a
/// training step's fused operations, even many of them, fall into every
/// window.
pub(crate) const TRIM_WINDOW: u64 = 64;

/// Ticks after which a window closes however few requests it saw: a
/// buffer that only rare operations ask for (an engine's fused gathers
/// among reductions done in place) would otherwise keep its largest size
/// for as many minutes as its 64 requests take. An engine ticks once a
/// cycle (1 ms by default): a few seconds, longer than a training step.
pub(crate) const TRIM_TICKS: u64 = 4096;

/// A slot is trimmed when it holds more than this many halves of what its
/// window asked of it (one and a half times).
pub(crate) const TRIM_HALVES: usize = 3;

/// What serves a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Serve {
    /// The slot's allocation, as it is.
    Reuse,
    /// A new allocation, to be reported with [`Retention::admit`].
    Allocate,
}

/// One kept slot.
#[derive(Clone, Debug)]
struct Held<K> {
    key: K,
    bytes: usize,
    /// The request that last used it (the ledger's clock).
    last_used: u64,
    /// The largest request it served in the current window, in bytes.
    peak: usize,
}

/// The ledger of the slots a shell keeps, by key `K`, with their sizes in
/// bytes (see the module's doc).
#[derive(Clone, Debug)]
pub(crate) struct Retention<K> {
    budget: usize,
    window: u64,
    /// The trim bound, in halves of a window's largest request.
    halves: usize,
    /// Requests so far.
    clock: u64,
    /// The clock when the current window began.
    window_start: u64,
    /// Ticks since the current window began, and how many close it.
    ticks: u64,
    tick_window: u64,
    /// Few (devices times dtypes): a list beats a map.
    held: Vec<Held<K>>,
    total: usize,
}

impl<K: Copy + Eq> Retention<K> {
    /// A ledger keeping at most `budget` bytes (but always the slot last
    /// requested), trimmed every [`TRIM_WINDOW`] requests.
    pub(crate) fn new(budget: usize) -> Self {
        Self::with_trim(budget, TRIM_WINDOW, TRIM_HALVES)
    }

    /// A ledger with its own trim window (in requests, at least 1) and
    /// bound (in halves of a window's largest request).
    pub(crate) fn with_trim(budget: usize, window: u64, halves: usize) -> Self {
        Retention {
            budget,
            window: window.max(1),
            halves,
            clock: 0,
            window_start: 0,
            ticks: 0,
            tick_window: TRIM_TICKS,
            held: Vec::new(),
            total: 0,
        }
    }

    /// The byte budget.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes kept in all slots together.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// The kept slots and their sizes, in no particular order.
    pub(crate) fn slots(&self) -> impl Iterator<Item = (K, usize)> + '_ {
        self.held.iter().map(|h| (h.key, h.bytes))
    }

    /// The size of `key`'s slot, if kept.
    #[cfg(test)]
    pub(crate) fn bytes(&self, key: K) -> Option<usize> {
        self.position(key).map(|i| self.held[i].bytes)
    }

    /// Gives up every slot at once (the owner empties its cache); the
    /// windows go on as they were. Returns the slots to free.
    pub(crate) fn release_all(&mut self) -> Vec<K> {
        self.total = 0;
        self.held.drain(..).map(|h| h.key).collect()
    }

    fn position(&self, key: K) -> Option<usize> {
        self.held.iter().position(|h| h.key == key)
    }

    fn remove_at(&mut self, index: usize, freed: &mut Vec<K>) {
        let gone = self.held.swap_remove(index);
        self.total -= gone.bytes;
        freed.push(gone.key);
    }

    /// Frees the least recently used slot other than `keep`; false when
    /// there is none.
    fn free_least_recent(&mut self, keep: K, freed: &mut Vec<K>) -> bool {
        let lru = self
            .held
            .iter()
            .enumerate()
            .filter(|(_, h)| h.key != keep)
            .min_by_key(|(_, h)| h.last_used)
            .map(|(i, _)| i);
        match lru {
            Some(index) => {
                self.remove_at(index, freed);
                true
            }
            None => false,
        }
    }

    /// A request for `need` bytes in `key`'s slot. `fits` says whether the
    /// allocation kept there (if any) can serve it: of the requested
    /// element type and long enough. Returns what serves it and the slots
    /// to free now, before anything is allocated (`key`'s own among them
    /// when it does not fit or is trimmed). Frees nothing, and allocates
    /// nothing, when the slot serves the request and no window closes.
    pub(crate) fn request(&mut self, key: K, need: usize, fits: bool) -> (Serve, Vec<K>) {
        self.clock += 1;
        let mut freed = Vec::new();
        if self.clock - self.window_start > self.window {
            self.close_window(Some((key, need)), &mut freed);
        }
        match self.position(key) {
            Some(index) if fits => {
                let held = &mut self.held[index];
                held.last_used = self.clock;
                held.peak = held.peak.max(need);
                return (Serve::Reuse, freed);
            }
            Some(index) => self.remove_at(index, &mut freed),
            None => {}
        }
        while self.total.saturating_add(need) > self.budget
            && self.free_least_recent(key, &mut freed)
        {}
        (Serve::Allocate, freed)
    }

    /// Trims the slots that held more than `halves` halves of what the window
    /// now closing asked of them, and opens the next. The slot requested
    /// now counts this request too: it is not replaced by one of nearly
    /// the same size.
    fn close_window(&mut self, asking: Option<(K, usize)>, freed: &mut Vec<K>) {
        self.window_start = self.clock.saturating_sub(u64::from(asking.is_some()));
        self.ticks = 0;
        let mut index = 0;
        while index < self.held.len() {
            let held = &mut self.held[index];
            let asked = match asking {
                Some((key, need)) if held.key == key => held.peak.max(need),
                _ => held.peak,
            };
            if held.bytes.saturating_mul(2) > asked.saturating_mul(self.halves) {
                self.remove_at(index, freed);
            } else {
                held.peak = 0;
                index += 1;
            }
        }
    }

    /// One tick of the owner's clock (an engine's cycle): closes the
    /// window after [`TRIM_TICKS`] of them, trimming as a request would.
    /// Returns the slots to free.
    pub(crate) fn tick(&mut self) -> Vec<K> {
        self.ticks += 1;
        let mut freed = Vec::new();
        if self.ticks >= self.tick_window {
            self.close_window(None, &mut freed);
        }
        freed
    }

    /// Records the allocation of `bytes` made for a request of `need`
    /// bytes in `key`'s slot after [`request`](Self::request) answered
    /// [`Serve::Allocate`]. Returns the other slots to free because it
    /// came out larger than asked and past the budget.
    pub(crate) fn admit(&mut self, key: K, bytes: usize, need: usize) -> Vec<K> {
        let mut freed = Vec::new();
        if let Some(index) = self.position(key) {
            // Not after `request`'s answer (a shell's bug): the old
            // allocation is replaced, so it is no longer counted.
            let old = self.held.swap_remove(index);
            self.total -= old.bytes;
        }
        self.held.push(Held {
            key,
            bytes,
            last_used: self.clock,
            peak: need,
        });
        self.total = self.total.saturating_add(bytes);
        while self.total > self.budget && self.free_least_recent(key, &mut freed) {}
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Serves a request as a shell would, allocating exactly what is
    /// asked; returns what was freed.
    fn serve(ledger: &mut Retention<u8>, key: u8, need: usize) -> Vec<u8> {
        let fits = ledger.bytes(key).is_some_and(|b| b >= need);
        let (serve, mut freed) = ledger.request(key, need, fits);
        if serve == Serve::Allocate {
            freed.extend(ledger.admit(key, need, need));
        }
        freed
    }

    #[test]
    fn a_repeated_request_reuses_its_slot_window_after_window() {
        let mut ledger = Retention::new(100);
        assert_eq!(ledger.request(1, 40, false), (Serve::Allocate, vec![]));
        assert!(ledger.admit(1, 40, 40).is_empty());
        for _ in 0..10 * TRIM_WINDOW {
            assert_eq!(ledger.request(1, 40, true), (Serve::Reuse, vec![]));
        }
        assert_eq!(ledger.total(), 40);
    }

    #[test]
    fn two_dtypes_used_every_step_keep_both_within_the_budget() {
        let mut ledger = Retention::new(100);
        serve(&mut ledger, 1, 50);
        serve(&mut ledger, 2, 30);
        for _ in 0..10 * TRIM_WINDOW {
            assert_eq!(ledger.request(1, 50, true), (Serve::Reuse, vec![]));
            assert_eq!(ledger.request(2, 25, true), (Serve::Reuse, vec![]));
        }
        assert_eq!(ledger.total(), 80);
    }

    #[test]
    fn allocating_past_the_budget_frees_the_least_recently_used_first() {
        let mut ledger = Retention::new(100);
        serve(&mut ledger, 1, 30);
        serve(&mut ledger, 2, 30);
        serve(&mut ledger, 3, 30);
        // Slot 1 used again: slot 2 is now the least recent.
        assert_eq!(ledger.request(1, 30, true), (Serve::Reuse, vec![]));
        assert_eq!(serve(&mut ledger, 4, 30), [2]);
        assert_eq!(serve(&mut ledger, 5, 70), [3, 1]);
        assert_eq!(ledger.total(), 100);
    }

    #[test]
    fn a_request_larger_than_the_budget_is_served_alone() {
        let mut ledger = Retention::new(100);
        serve(&mut ledger, 1, 60);
        serve(&mut ledger, 2, 20);
        let mut freed = serve(&mut ledger, 3, 500);
        freed.sort();
        assert_eq!(freed, [1, 2]);
        assert_eq!((ledger.total(), ledger.bytes(3)), (500, Some(500)));
        assert_eq!(ledger.request(3, 500, true), (Serve::Reuse, vec![]));
        // The next other slot needs room: the large one goes.
        assert_eq!(serve(&mut ledger, 1, 10), [3]);
        assert_eq!(ledger.total(), 10);
    }

    #[test]
    fn a_growing_slot_frees_its_old_allocation_before_the_new_one() {
        let mut ledger = Retention::new(100);
        serve(&mut ledger, 2, 50);
        serve(&mut ledger, 1, 10);
        assert_eq!(ledger.request(1, 20, false), (Serve::Allocate, vec![1]));
        assert_eq!(ledger.total(), 50);
        // The allocation came out larger than asked: the others make room.
        assert_eq!(ledger.admit(1, 60, 20), [2]);
        assert_eq!(ledger.total(), 60);
    }

    #[test]
    fn a_slot_unused_or_much_larger_than_its_use_for_a_window_is_trimmed() {
        let mut ledger = Retention::with_trim(1000, 4, 8);
        // Requests 1 to 4: slot 1 serves 400 bytes once, then 50.
        serve(&mut ledger, 1, 400);
        serve(&mut ledger, 2, 10);
        serve(&mut ledger, 3, 10);
        assert_eq!(ledger.request(1, 50, true), (Serve::Reuse, vec![]));
        // Request 5 closes that window: slot 1 served 400 in it, slots 2
        // and 3 their size.
        assert_eq!(ledger.request(1, 50, true), (Serve::Reuse, vec![]));
        for _ in 6..=8 {
            assert_eq!(ledger.request(1, 50, true), (Serve::Reuse, vec![]));
        }
        // Request 9 closes a window in which slot 1 served at most 50
        // (400 > 4 * 50) and slot 3 nothing; slot 2, requested now, fits.
        let (serve_now, mut freed) = ledger.request(2, 10, true);
        freed.sort();
        assert_eq!((serve_now, freed), (Serve::Reuse, vec![1, 3]));
        assert_eq!(ledger.total(), 10);
        // Slot 1 comes back at the size now asked.
        assert_eq!(serve(&mut ledger, 1, 50), []);
        assert_eq!(ledger.total(), 60);
    }

    #[test]
    fn the_slot_requested_as_a_window_closes_is_kept_when_it_fits_this_request() {
        let mut ledger = Retention::with_trim(1000, 2, 8);
        serve(&mut ledger, 1, 400);
        for _ in 0..3 {
            serve(&mut ledger, 2, 10);
        }
        // Request 5 closes a window without slot 1, but it wants 300 of
        // its 400 bytes: within the factor, so it is reused.
        assert_eq!(ledger.request(1, 300, true), (Serve::Reuse, vec![]));
        assert_eq!(ledger.total(), 410);
    }

    #[test]
    fn a_rare_large_request_is_not_kept_alive_by_smaller_ones() {
        let mut ledger = Retention::new(1 << 30);
        for _ in 0..TRIM_WINDOW {
            serve(&mut ledger, 1, 4 << 20);
        }
        // Once, four times as much; then the usual size again, which
        // four-fold slack would have let keep the large buffer forever.
        serve(&mut ledger, 1, 16 << 20);
        for _ in 0..2 * TRIM_WINDOW {
            serve(&mut ledger, 1, 4 << 20);
        }
        assert_eq!(ledger.total(), 4 << 20);
        // Requests that vary within the bound keep their slot.
        serve(&mut ledger, 1, 6 << 20);
        for i in 0..4 * TRIM_WINDOW as usize {
            let need = if i % 2 == 0 { 4 << 20 } else { 5 << 20 };
            assert_eq!(ledger.request(1, need, true).0, Serve::Reuse);
        }
        assert_eq!(ledger.total(), 6 << 20);
    }

    #[test]
    fn ticks_close_a_window_that_few_requests_reach() {
        let mut ledger = Retention::new(1 << 30);
        serve(&mut ledger, 1, 64 << 20);
        serve(&mut ledger, 2, 1 << 20);
        // A second large request within the first window keeps slot 1.
        for _ in 1..TRIM_TICKS {
            assert!(ledger.tick().is_empty());
        }
        assert_eq!(ledger.request(1, 48 << 20, true).0, Serve::Reuse);
        assert_eq!(ledger.tick(), Vec::<u8>::new());
        // A window of ticks without a request frees both.
        for _ in 1..TRIM_TICKS {
            assert!(ledger.tick().is_empty());
        }
        let mut freed = ledger.tick();
        freed.sort();
        assert_eq!(freed, [1, 2]);
        assert_eq!(ledger.total(), 0);
    }

    #[derive(Clone, Debug)]
    struct Step {
        key: u8,
        need: usize,
        /// The kept allocation is of another element type: it does not fit.
        other_type: bool,
        /// How much larger than asked the allocation comes out.
        slack: usize,
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            0u8..5,
            prop_oneof![0usize..64, 0usize..1024, 0usize..4096],
            prop::bool::weighted(0.1),
            prop_oneof![Just(0usize), 0usize..64],
        )
            .prop_map(|(key, need, other_type, slack)| Step {
                key,
                need,
                other_type,
                slack,
            })
    }

    proptest! {
        /// After any sequence of requests: the requested slot is kept and
        /// large enough; the kept slots add up to the total; and the total
        /// is within the budget, or the requested slot is the only one kept.
        #[test]
        fn the_requested_slot_is_served_and_the_total_stays_within_the_budget(
            budget in prop_oneof![Just(0usize), 0usize..256, 0usize..8192],
            window in 1u64..20,
            halves in 2usize..12,
            steps in prop::collection::vec(step(), 1..200),
        ) {
            let mut ledger = Retention::with_trim(budget, window, halves);
            let mut shell: Vec<(u8, usize)> = Vec::new();
            for s in steps {
                let fits = !s.other_type && ledger.bytes(s.key).is_some_and(|b| b >= s.need);
                let (serve, freed) = ledger.request(s.key, s.need, fits);
                for key in freed {
                    let at = shell.iter().position(|&(k, _)| k == key);
                    prop_assert!(at.is_some(), "freed slot {} that was not kept", key);
                    shell.retain(|&(k, _)| k != key);
                }
                match serve {
                    Serve::Reuse => prop_assert!(fits),
                    Serve::Allocate => {
                        prop_assert!(shell.iter().all(|&(k, _)| k != s.key));
                        let bytes = s.need + s.slack;
                        shell.push((s.key, bytes));
                        for key in ledger.admit(s.key, bytes, s.need) {
                            prop_assert_ne!(key, s.key);
                            shell.retain(|&(k, _)| k != key);
                        }
                    }
                }
                let held = ledger.bytes(s.key);
                prop_assert!(held.is_some_and(|b| b >= s.need), "slot {} not served", s.key);
                let mut kept: Vec<(u8, usize)> = ledger.slots().collect();
                kept.sort();
                shell.sort();
                prop_assert_eq!(&kept, &shell);
                prop_assert_eq!(ledger.total(), kept.iter().map(|&(_, b)| b).sum::<usize>());
                prop_assert!(
                    ledger.total() <= ledger.budget() || kept.len() == 1,
                    "{} bytes in {} slots over a budget of {}",
                    ledger.total(),
                    kept.len(),
                    budget
                );
            }
        }
    }
}
