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

/// The entries in flight, the requests the background thread has not
/// taken yet, and whether new entries are still accepted.
#[derive(Default)]
pub(crate) struct Table {
    entries: HashMap<String, Entry>,
    /// Requests of inserted entries, for the background thread's next
    /// cycle. Submitters only wake the thread when this was empty: a
    /// burst of submissions costs one wake-up, not one per tensor.
    queued: Vec<Request>,
    /// Set once the engine stopped: why new operations are refused.
    closed: Option<Error>,
}

impl Table {
    /// Adds every entry, or none: fails if the engine stopped or a name is
    /// in flight (or given twice).
    /// Queues `requests` (those of `entries`) for the background thread;
    /// returns whether the queue was empty, i.e. whether the thread needs
    /// waking.
    pub(crate) fn insert_all(
        &mut self,
        entries: Vec<Entry>,
        requests: Vec<Request>,
    ) -> Result<bool, Error> {
        if let Some(reason) = &self.closed {
            return Err(reason.clone());
        }
        if let [entry] = entries.as_slice() {
            // The common case, without the set.
            if self.entries.contains_key(&entry.request.tensor_name) {
                return Err(Error::DuplicateName {
                    tensor: entry.request.tensor_name.clone(),
                });
            }
        } else {
            // A set of the group's names: a pairwise scan was quadratic in
            // the group's size (half the CPU of a 1,000-tensor grouped
            // submit).
            let mut seen = HashSet::with_capacity(entries.len());
            for entry in &entries {
                let name = &entry.request.tensor_name;
                if self.entries.contains_key(name) || !seen.insert(name.as_str()) {
                    return Err(Error::DuplicateName {
                        tensor: name.clone(),
                    });
                }
            }
        }
        for entry in entries {
            self.entries
                .insert(entry.request.tensor_name.clone(), entry);
        }
        let wake = self.queued.is_empty();
        if wake {
            self.queued = requests;
        } else {
            self.queued.extend(requests);
        }
        Ok(wake)
    }

    /// Takes the queued requests, in submission order.
    pub(crate) fn take_queued(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.queued)
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

    fn request(name: &str) -> Request {
        Request::new(0, name, RequestKind::Allreduce, DataType::F32, vec![1])
    }

    fn entry(name: &str) -> Entry {
        Entry {
            request: request(name),
            input: Box::new(vec![0f32]),
            completion: Completion::new(),
        }
    }

    fn insert(table: &mut Table, names: &[&str]) -> Result<bool, Error> {
        let entries = names.iter().map(|n| entry(n)).collect();
        let requests = names.iter().map(|n| request(n)).collect();
        table.insert_all(entries, requests)
    }

    #[test]
    fn names_in_flight_are_unique() {
        let mut table = Table::default();
        insert(&mut table, &["a"]).unwrap();
        assert_eq!(
            insert(&mut table, &["b", "a"]).err(),
            Some(Error::DuplicateName { tensor: "a".into() })
        );
        assert!(table.take("b").is_none(), "a failed group inserts nothing");
        assert_eq!(
            insert(&mut table, &["c", "c"]).err(),
            Some(Error::DuplicateName { tensor: "c".into() })
        );
        assert_eq!(
            insert(&mut table, &["a"]).err(),
            Some(Error::DuplicateName { tensor: "a".into() })
        );
        assert!(table.take("a").is_some());
        insert(&mut table, &["a"]).unwrap();
    }

    #[test]
    fn only_the_first_submission_after_a_take_wakes_the_engine() {
        let mut table = Table::default();
        assert_eq!(insert(&mut table, &["a"]), Ok(true));
        assert_eq!(insert(&mut table, &["b", "c"]), Ok(false));
        assert_eq!(
            insert(&mut table, &["b"]).ok(),
            None,
            "a refused submission queues nothing"
        );
        let names: Vec<String> = table
            .take_queued()
            .into_iter()
            .map(|r| r.tensor_name)
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(table.take_queued().is_empty());
        assert_eq!(insert(&mut table, &["d"]), Ok(true));
    }

    #[test]
    fn closing_refuses_and_drains() {
        let mut table = Table::default();
        insert(&mut table, &["a", "b"]).unwrap();
        let drained = table.close(Error::ShutDown { by_ranks: vec![1] });
        assert_eq!(drained.len(), 2);
        assert!(table
            .close(Error::ShutDown { by_ranks: vec![0] })
            .is_empty());
        assert_eq!(table.closed(), Some(&Error::ShutDown { by_ranks: vec![1] }));
        assert_eq!(
            insert(&mut table, &["c"]).err(),
            Some(Error::ShutDown { by_ranks: vec![1] })
        );
    }
}
