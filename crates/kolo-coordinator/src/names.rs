//! This rank's tensor ids. The caller (the engine's tensor table) names
//! every tensor it submits with a small integer of its choosing, once, and
//! from then on hands the coordinator only ids: the fast path of a cycle
//! indexes arrays by id and never hashes, compares or copies a name. Names
//! are looked up only where they travel or are reported: requests sent to
//! rank 0, rank 0's responses, the timeline and stall messages.

use std::collections::HashMap;
use std::sync::Arc;

/// A rank-local name for a tensor, chosen by the caller of
/// [`crate::Coordinator::register`]. Ids are small (they index arrays) and
/// mean nothing to other ranks, which may use other ids for the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    /// The id as an array index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for TensorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Why an id cannot be registered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The id already names another tensor.
    #[error("tensor id {id} already names '{existing}', not '{name}'")]
    IdTaken {
        /// The id.
        id: TensorId,
        /// The name it has.
        existing: String,
        /// The name asked for.
        name: String,
    },
    /// The name already has another id.
    #[error("tensor '{name}' already has id {existing}, not {id}")]
    NameTaken {
        /// The name.
        name: String,
        /// Its id.
        existing: TensorId,
        /// The id asked for.
        id: TensorId,
    },
}

/// Ids and names, both ways.
#[derive(Clone, Debug, Default)]
pub struct Names {
    by_id: Vec<Option<Arc<str>>>,
    by_name: HashMap<Arc<str>, TensorId>,
}

impl Names {
    /// No ids.
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives `name` the id `id`. Registering a pair again is a no-op.
    pub fn register(&mut self, id: TensorId, name: &str) -> Result<(), NameError> {
        if let Some(existing) = self.name(id) {
            if existing == name {
                return Ok(());
            }
            return Err(NameError::IdTaken {
                id,
                existing: existing.to_owned(),
                name: name.to_owned(),
            });
        }
        if let Some(&existing) = self.by_name.get(name) {
            return Err(NameError::NameTaken {
                name: name.to_owned(),
                existing,
                id,
            });
        }
        let name: Arc<str> = Arc::from(name);
        if self.by_id.len() <= id.index() {
            self.by_id.resize(id.index() + 1, None);
        }
        self.by_id[id.index()] = Some(Arc::clone(&name));
        self.by_name.insert(name, id);
        Ok(())
    }

    /// Drops `id` and its name.
    pub fn forget(&mut self, id: TensorId) {
        if let Some(name) = self.by_id.get_mut(id.index()).and_then(Option::take) {
            self.by_name.remove(&name);
        }
    }

    /// The name of `id`.
    pub fn name(&self, id: TensorId) -> Option<&str> {
        self.shared(id).map(|name| &**name)
    }

    /// The name of `id`, shareable.
    pub fn shared(&self, id: TensorId) -> Option<&Arc<str>> {
        self.by_id.get(id.index())?.as_ref()
    }

    /// The id of `name`.
    pub fn id(&self, name: &str) -> Option<TensorId> {
        self.by_name.get(name).copied()
    }

    /// One more than the highest id ever registered (ids below it may be
    /// free).
    pub fn end(&self) -> u32 {
        self.by_id.len() as u32
    }

    /// Number of registered ids.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// True when no id is registered.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ways_and_conflicts() {
        let mut names = Names::new();
        names.register(TensorId(3), "a").unwrap();
        names.register(TensorId(3), "a").unwrap();
        assert_eq!(names.name(TensorId(3)), Some("a"));
        assert_eq!(names.id("a"), Some(TensorId(3)));
        assert_eq!(names.end(), 4);
        assert!(matches!(
            names.register(TensorId(3), "b"),
            Err(NameError::IdTaken { .. })
        ));
        let err = names.register(TensorId(1), "a").unwrap_err();
        assert_eq!(err.to_string(), "tensor 'a' already has id #3, not #1");
        names.forget(TensorId(3));
        assert_eq!(names.id("a"), None);
        assert!(names.is_empty());
        names.register(TensorId(1), "a").unwrap();
        assert_eq!(names.len(), 1);
    }
}
