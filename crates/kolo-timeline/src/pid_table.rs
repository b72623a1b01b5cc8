//! Tensor name -> trace "process" id.
//!
//! Every tensor is its own row in the viewer, and a row is a process in the
//! trace-event format. Ids are small integers handed out on first sight,
//! starting at [`FIRST_TENSOR_PID`]; pid 0 is kept for global events (cycle
//! markers).

use std::collections::HashMap;

/// The pid given to the first tensor seen.
pub(crate) const FIRST_TENSOR_PID: u32 = 1;

/// Assigns each distinct tensor name a pid, in order of first sight.
#[derive(Debug, Default)]
pub(crate) struct PidTable {
    pids: HashMap<String, u32>,
}

impl PidTable {
    /// The pid of `tensor`, and whether it was assigned just now (so that
    /// the caller writes the row's metadata once).
    pub(crate) fn pid_of(&mut self, tensor: &str) -> (u32, bool) {
        if let Some(&pid) = self.pids.get(tensor) {
            return (pid, false);
        }
        // More than u32::MAX distinct tensors cannot be held in memory
        // anyway; saturating keeps this total.
        let pid = u32::try_from(self.pids.len())
            .unwrap_or(u32::MAX - FIRST_TENSOR_PID)
            .saturating_add(FIRST_TENSOR_PID);
        self.pids.insert(tensor.to_owned(), pid);
        (pid, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_sight_assigns_next_pid_and_repeats_are_stable() {
        let mut table = PidTable::default();
        assert_eq!(table.pid_of("a"), (1, true));
        assert_eq!(table.pid_of("b"), (2, true));
        assert_eq!(table.pid_of("a"), (1, false));
        assert_eq!(table.pid_of("b"), (2, false));
    }

    proptest! {
        #[test]
        fn pids_are_dense_and_one_per_name(names in proptest::collection::vec("[a-d]{1,2}", 0..60)) {
            let mut table = PidTable::default();
            let mut seen: HashMap<String, u32> = HashMap::new();
            for name in &names {
                let (pid, new) = table.pid_of(name);
                prop_assert_eq!(new, !seen.contains_key(name));
                let expected = *seen.entry(name.clone()).or_insert(pid);
                prop_assert_eq!(pid, expected);
                prop_assert!(pid >= FIRST_TENSOR_PID);
                prop_assert!(pid as usize <= seen.len());
            }
            prop_assert_eq!(table.pids.len(), seen.len());
        }
    }
}
