//! The tensor table: the operations in flight on this rank, by name.

use crate::error::Error;
use crate::handle::{Completion, Payload};
use kolo_protocol::Request;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One tensor submitted on this rank and not yet completed.
pub(crate) struct Entry {
    /// What this rank asked for.
    pub request: Request,
    /// The engine's own copy of the input (`Vec<T>` of the request's dtype).
    pub input: Payload,
    /// Where the result goes.
    pub completion: Arc<Completion>,
}

/// The entries in flight, and whether new ones are still accepted.
#[derive(Default)]
pub(crate) struct Table {
    entries: HashMap<String, Entry>,
    /// Set once the engine stopped: why new operations are refused.
    closed: Option<Error>,
}

impl Table {
    /// Adds every entry, or none: fails if the engine stopped or a name is
    /// in flight (or given twice).
    pub(crate) fn insert_all(&mut self, entries: Vec<Entry>) -> Result<(), Error> {
        if let Some(reason) = &self.closed {
            return Err(reason.clone());
        }
        // A set of the group's names: a pairwise scan was quadratic in the
        // group's size (half the CPU of a 1,000-tensor grouped submit).
        let mut seen = HashSet::with_capacity(entries.len());
        for entry in &entries {
            let name = &entry.request.tensor_name;
            if self.entries.contains_key(name) || !seen.insert(name.as_str()) {
                return Err(Error::DuplicateName {
                    tensor: name.clone(),
                });
            }
        }
        for entry in entries {
            self.entries
                .insert(entry.request.tensor_name.clone(), entry);
        }
        Ok(())
    }

    /// Removes and returns the entry of `name`, if in flight.
    pub(crate) fn take(&mut self, name: &str) -> Option<Entry> {
        self.entries.remove(name)
    }

    /// Refuses new entries from now on (keeping the first reason given)
    /// and returns the entries in flight, for the caller to fail outside
    /// the lock.
    pub(crate) fn close(&mut self, reason: Error) -> Vec<Entry> {
        self.closed.get_or_insert(reason);
        self.entries.drain().map(|(_, entry)| entry).collect()
    }

    /// Why the engine stopped, if it did.
    pub(crate) fn closed(&self) -> Option<&Error> {
        self.closed.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::{DataType, RequestKind};

    fn entry(name: &str) -> Entry {
        Entry {
            request: Request::new(0, name, RequestKind::Allreduce, DataType::F32, vec![1]),
            input: Box::new(vec![0f32]),
            completion: Completion::new(),
        }
    }

    #[test]
    fn names_in_flight_are_unique() {
        let mut table = Table::default();
        table.insert_all(vec![entry("a")]).unwrap();
        assert_eq!(
            table.insert_all(vec![entry("b"), entry("a")]).err(),
            Some(Error::DuplicateName { tensor: "a".into() })
        );
        assert!(table.take("b").is_none(), "a failed group inserts nothing");
        assert_eq!(
            table.insert_all(vec![entry("c"), entry("c")]).err(),
            Some(Error::DuplicateName { tensor: "c".into() })
        );
        assert!(table.take("a").is_some());
        table.insert_all(vec![entry("a")]).unwrap();
    }

    #[test]
    fn closing_refuses_and_drains() {
        let mut table = Table::default();
        table.insert_all(vec![entry("a"), entry("b")]).unwrap();
        let drained = table.close(Error::ShutDown { by_ranks: vec![1] });
        assert_eq!(drained.len(), 2);
        assert!(table
            .close(Error::ShutDown { by_ranks: vec![0] })
            .is_empty());
        assert_eq!(table.closed(), Some(&Error::ShutDown { by_ranks: vec![1] }));
        assert_eq!(
            table.insert_all(vec![entry("c")]).err(),
            Some(Error::ShutDown { by_ranks: vec![1] })
        );
    }
}
