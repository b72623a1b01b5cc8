//! [`TensorGroup`]: the names of tensors submitted together step after
//! step, checked once.

use crate::engine::names::TensorNames;
use crate::error::Error;
use crate::placed::PlacedMut;
use crate::tensor::shape_problem;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// The names of a group of tensors submitted together step after step (a
/// model's gradients, a bucket of them), checked once: a submission with
/// a `TensorGroup` passes only the buffers, and the engine recognises the
/// group without reading a name (as MPI's persistent collectives and
/// PyTorch DDP's buckets fix what repeats). Cheap to clone: clones are the
/// same group.
///
/// ```
/// let names: Vec<String> = (0..8).map(|i| format!("grad/{i}")).collect();
/// let group = kolo::TensorGroup::new(&names)?;
/// kolo::threads::run(2, kolo::Config::default(), |kolo| {
///     let mut grads = vec![vec![kolo.rank() as f32 + 1.0; 64]; 8];
///     for _step in 0..3 {
///         kolo.scope(|s| {
///             let bufs = grads.iter_mut().map(|g| &mut g[..]);
///             s.allreduce_group_async(&group, bufs, kolo::ReduceOp::Average)?.wait()
///         })?;
///     }
///     assert!(grads.iter().flatten().all(|&x| x == 1.5));
///     Ok(())
/// })?;
/// # Ok::<(), kolo::Error>(())
/// ```
#[derive(Clone)]
pub struct TensorGroup {
    names: Arc<TensorNames>,
}

impl TensorGroup {
    /// The group of `names`, in order (the order in which every later
    /// submission passes the buffers). A name given twice is an
    /// [`Error::InvalidArgument`] naming it and both places.
    pub fn new<I>(names: I) -> Result<TensorGroup, Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names = names.into_iter();
        let mut list = TensorNames::with_capacity(names.size_hint().0);
        let mut seen: FxHashMap<String, usize> = FxHashMap::default();
        for (index, name) in names.enumerate() {
            let name = name.as_ref();
            if let Some(first) = seen.insert(name.to_owned(), index) {
                return Err(Error::InvalidArgument {
                    tensor: name.to_owned(),
                    reason: format!("named twice in a tensor group (tensors {first} and {index})"),
                });
            }
            list.push(name);
        }
        Ok(TensorGroup {
            names: Arc::new(list),
        })
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True for a group of no tensors.
    pub fn is_empty(&self) -> bool {
        self.names.len() == 0
    }

    /// The names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter()
    }

    /// The names, as the engine's submissions hold them.
    pub(crate) fn list(&self) -> &Arc<TensorNames> {
        &self.names
    }

    /// The name of tensor `index` ("" when out of range).
    pub(crate) fn name(&self, index: usize) -> &str {
        self.names.get(index)
    }

    /// Checks the buffers `tensors` of a submission of this group (one per
    /// tensor, each shape fitting its buffer) and hands each to `f`, in
    /// order, as its elements and dimensions. The first problem is an
    /// [`Error::InvalidArgument`] naming the tensor (a count that does not
    /// fit names the first).
    #[inline]
    pub(crate) fn each_buffer<'t, T: 't>(
        &self,
        tensors: impl Iterator<Item = PlacedMut<'t, T>>,
        mut f: impl FnMut(&'t mut [T], &[usize]),
    ) -> Result<(), Error> {
        let mut given = 0;
        for tensor in tensors {
            if given == self.len() {
                return Err(self.count_error(format!("more than {given}")));
            }
            let (data, shape) = match tensor {
                PlacedMut::Host(tensor) => tensor.into_parts(),
                #[cfg(feature = "nccl")]
                other => return Err(self.memory_error(given, "host memory", other.memory())),
            };
            if let Some(reason) = shape_problem(&shape, data.len()) {
                return Err(Error::InvalidArgument {
                    tensor: self.name(given).to_owned(),
                    reason,
                });
            }
            f(data, &shape);
            given += 1;
        }
        if given != self.len() {
            return Err(self.count_error(given.to_string()));
        }
        Ok(())
    }

    /// The error of tensor `index`, in `memory` where the group's first
    /// tensor is in `first`.
    #[cfg(feature = "nccl")]
    pub(crate) fn memory_error(&self, index: usize, first: &str, memory: &str) -> Error {
        Error::InvalidArgument {
            tensor: self.name(index).to_owned(),
            reason: format!(
                "the tensor is in {memory}, but the group's first tensor is in {first}"
            ),
        }
    }

    /// Fails unless `given` buffers, one per tensor, were given.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn check_count(&self, given: usize) -> Result<(), Error> {
        if given == self.len() {
            Ok(())
        } else {
            Err(self.count_error(given.to_string()))
        }
    }

    /// The error for a submission of `given` buffers (a count, or "more
    /// than N") to this group, naming its first tensor.
    fn count_error(&self, given: String) -> Error {
        Error::InvalidArgument {
            tensor: self.name(0).to_owned(),
            reason: format!(
                "a tensor group of {} tensors got {given} buffers",
                self.len()
            ),
        }
    }
}

impl std::fmt::Debug for TensorGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorGroup")
            .field("len", &self.len())
            .field("first", &self.names.first())
            .finish()
    }
}
