//! The store's state and what each request does to it: plain functions
//! over data (the server is a thin shell of sockets and waits around
//! them). Bounded: at most [`MAX_KEYS`] keys and [`MAX_BYTES`] of keys
//! and values together, so that no client can grow the host's memory
//! without end.

use crate::wire::{request_problem, Reply, Request};
use std::collections::HashMap;

/// The most keys the store holds.
pub const MAX_KEYS: usize = 1 << 20;
/// The most bytes (keys and values) the store holds.
pub const MAX_BYTES: usize = 1 << 30;

/// The keys and values of one job.
#[derive(Debug, Default)]
pub struct Store {
    entries: HashMap<String, Vec<u8>>,
    bytes: usize,
}

/// What a request does, once applied (the fields say what their names
/// say).
#[allow(missing_docs)]
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered; `changed` when the store changed (waiters may now be
    /// answered).
    Answer { reply: Reply, changed: bool },
    /// A get or a wait whose keys are not all there yet.
    Pending { missing: Vec<String> },
}

impl Outcome {
    fn reply(reply: Reply) -> Outcome {
        Outcome::Answer {
            reply,
            changed: false,
        }
    }

    fn changed(reply: Reply) -> Outcome {
        Outcome::Answer {
            reply,
            changed: true,
        }
    }
}

impl Store {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.entries.get(key).map(Vec::as_slice)
    }

    /// Applies `request`: answers it, or says which keys it still waits
    /// for (a get or a wait, which the server retries when the store
    /// changes and fails when its timeout passes).
    pub fn apply(&mut self, request: &Request) -> Outcome {
        if let Some(problem) = request_problem(request) {
            return Outcome::reply(Reply::Error(problem));
        }
        match request {
            Request::Set { key, value } => match self.put(key, value.clone()) {
                Ok(()) => Outcome::changed(Reply::Done),
                Err(e) => Outcome::reply(Reply::Error(e)),
            },
            Request::Get { key, .. } => match self.entries.get(key) {
                Some(value) => Outcome::reply(Reply::Value(value.clone())),
                None => Outcome::Pending {
                    missing: vec![key.clone()],
                },
            },
            Request::Wait { keys, .. } => {
                let missing: Vec<String> = keys
                    .iter()
                    .filter(|k| !self.entries.contains_key(*k))
                    .cloned()
                    .collect();
                if missing.is_empty() {
                    Outcome::reply(Reply::Done)
                } else {
                    Outcome::Pending { missing }
                }
            }
            Request::Add { key, delta } => {
                let current = match self.entries.get(key) {
                    None => 0,
                    Some(value) => match parse_number(value) {
                        Some(n) => n,
                        None => {
                            return Outcome::reply(Reply::Error(format!(
                                "add to {key:?}: its value {:?} is not a number",
                                String::from_utf8_lossy(value)
                            )))
                        }
                    },
                };
                let Some(sum) = current.checked_add(*delta) else {
                    return Outcome::reply(Reply::Error(format!(
                        "add {delta} to {key:?}: {current} + {delta} overflows"
                    )));
                };
                match self.put(key, sum.to_string().into_bytes()) {
                    Ok(()) => Outcome::changed(Reply::Number(sum)),
                    Err(e) => Outcome::reply(Reply::Error(e)),
                }
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                if self.entries.get(key) == expected.as_ref() {
                    if let Err(e) = self.put(key, desired.clone()) {
                        return Outcome::reply(Reply::Error(e));
                    }
                    return Outcome::changed(Reply::Value(desired.clone()));
                }
                match self.entries.get(key) {
                    Some(value) => Outcome::reply(Reply::Value(value.clone())),
                    None => Outcome::reply(Reply::Existed(false)),
                }
            }
            Request::Delete { key } => match self.entries.remove(key) {
                Some(value) => {
                    self.bytes -= key.len() + value.len();
                    Outcome::changed(Reply::Existed(true))
                }
                None => Outcome::reply(Reply::Existed(false)),
            },
        }
    }

    /// Stores `value` at `key` within the bounds.
    fn put(&mut self, key: &str, value: Vec<u8>) -> Result<(), String> {
        let old = self.entries.get(key).map(|v| key.len() + v.len());
        if old.is_none() && self.entries.len() >= MAX_KEYS {
            return Err(format!(
                "set {key:?}: the store holds {MAX_KEYS} keys already"
            ));
        }
        let bytes = self.bytes - old.unwrap_or(0) + key.len() + value.len();
        if bytes > MAX_BYTES {
            return Err(format!(
                "set {key:?}: the store would hold {bytes} bytes (at most {MAX_BYTES})"
            ));
        }
        self.bytes = bytes;
        self.entries.insert(key.to_owned(), value);
        Ok(())
    }
}

/// A number as `add` stores it: ASCII decimal.
fn parse_number(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(key: &str, value: &[u8]) -> Request {
        Request::Set {
            key: key.into(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn a_get_waits_until_its_key_is_set() {
        let mut store = Store::default();
        let get = Request::Get {
            key: "a".into(),
            timeout_ms: 10,
        };
        assert_eq!(
            store.apply(&get),
            Outcome::Pending {
                missing: vec!["a".into()]
            }
        );
        assert_eq!(store.apply(&set("a", b"1")), Outcome::changed(Reply::Done));
        assert_eq!(
            store.apply(&get),
            Outcome::reply(Reply::Value(b"1".to_vec()))
        );
    }

    #[test]
    fn add_counts_and_refuses_what_is_not_a_number() {
        let mut store = Store::default();
        let add = |delta| Request::Add {
            key: "n".into(),
            delta,
        };
        assert_eq!(store.apply(&add(2)), Outcome::changed(Reply::Number(2)));
        assert_eq!(store.apply(&add(-5)), Outcome::changed(Reply::Number(-3)));
        store.apply(&set("n", b"x"));
        let Outcome::Answer {
            reply: Reply::Error(why),
            ..
        } = store.apply(&add(1))
        else {
            panic!("expected an error");
        };
        assert!(why.contains("not a number"), "{why}");
        store.apply(&set("n", i64::MAX.to_string().as_bytes()));
        assert!(matches!(
            store.apply(&add(1)),
            Outcome::Answer { reply: Reply::Error(why), .. } if why.contains("overflows")
        ));
    }

    #[test]
    fn compare_set_swaps_only_on_the_expected_value() {
        let mut store = Store::default();
        let cas = |expected: Option<&[u8]>, desired: &[u8]| Request::CompareSet {
            key: "k".into(),
            expected: expected.map(<[u8]>::to_vec),
            desired: desired.to_vec(),
        };
        assert_eq!(
            store.apply(&cas(Some(b"x"), b"y")),
            Outcome::reply(Reply::Existed(false))
        );
        assert_eq!(
            store.apply(&cas(None, b"first")),
            Outcome::changed(Reply::Value(b"first".to_vec()))
        );
        assert_eq!(
            store.apply(&cas(None, b"second")),
            Outcome::reply(Reply::Value(b"first".to_vec())),
            "the first one wins"
        );
        assert_eq!(
            store.apply(&cas(Some(b"first"), b"third")),
            Outcome::changed(Reply::Value(b"third".to_vec()))
        );
    }

    proptest! {
        /// Whatever the requests, the byte count stays the sum of the
        /// keys and values held, and never passes the bound.
        #[test]
        fn the_byte_count_matches_the_contents(ops in prop::collection::vec((0u8..4, 0usize..6, prop::collection::vec(any::<u8>(), 0..32)), 0..200)) {
            let mut store = Store::default();
            for (op, k, v) in ops {
                let key = format!("key{k}");
                let request = match op {
                    0 => Request::Set { key, value: v },
                    1 => Request::Delete { key },
                    2 => Request::Add { key, delta: v.len() as i64 },
                    _ => Request::CompareSet { key, expected: None, desired: v },
                };
                store.apply(&request);
                let sum: usize = store.entries.iter().map(|(k, v)| k.len() + v.len()).sum();
                prop_assert_eq!(store.bytes, sum);
                prop_assert!(store.bytes <= MAX_BYTES);
            }
        }
    }
}
