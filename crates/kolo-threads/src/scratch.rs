//! Reusable per-rank buffers for reduction results, kept across calls so a
//! collective does not allocate after its first use at a given size.

use std::any::Any;

/// The most one slot keeps: far above what the reductions ask for (a small
/// allreduce's output is at most 64 KiB, a prescale's copies 8 KiB per
/// rank), so that only a call nothing foresaw gives its buffer up instead
/// of keeping it for the life of the rank.
const KEPT_BYTES: usize = 4 << 20;

/// Which scratch buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Reduction output.
    Out = 0,
    /// Prescaled copies of the inputs.
    Scaled = 1,
}

/// Typed scratch vectors, one per [`Slot`], each of the element type last
/// used in it.
#[derive(Default)]
pub(crate) struct Scratch {
    slots: [Option<Box<dyn Any + Send>>; 2],
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch").finish_non_exhaustive()
    }
}

impl Scratch {
    /// Takes the vector of `slot` with at least `len` elements (a fresh
    /// one if the slot held another type); give it back with
    /// [`Scratch::put`].
    pub(crate) fn take<T: Copy + Default + Send + 'static>(
        &mut self,
        slot: Slot,
        len: usize,
    ) -> Vec<T> {
        let mut vec = self.slots[slot as usize]
            .as_mut()
            .and_then(|any| any.downcast_mut::<Vec<T>>())
            .map(std::mem::take)
            .unwrap_or_default();
        if vec.len() < len {
            vec.resize(len, T::default());
        }
        vec
    }

    /// Returns a vector taken with [`Scratch::take`] (into the box it came
    /// from, so steady use allocates nothing); one larger than
    /// [`KEPT_BYTES`] is dropped.
    pub(crate) fn put<T: Send + 'static>(&mut self, slot: Slot, vec: Vec<T>) {
        if vec.capacity().saturating_mul(std::mem::size_of::<T>()) > KEPT_BYTES {
            return;
        }
        let held = &mut self.slots[slot as usize];
        match held.as_mut().and_then(|any| any.downcast_mut::<Vec<T>>()) {
            Some(inner) => *inner = vec,
            None => *held = Some(Box::new(vec)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_the_allocation_of_the_same_type() {
        let mut scratch = Scratch::default();
        let vec = scratch.take::<f32>(Slot::Out, 100);
        let ptr = vec.as_ptr();
        scratch.put(Slot::Out, vec);
        let vec = scratch.take::<f32>(Slot::Out, 50);
        assert_eq!((vec.as_ptr(), vec.len()), (ptr, 100));
        scratch.put(Slot::Out, vec);
        let other = scratch.take::<i64>(Slot::Out, 3);
        assert_eq!(other.len(), 3);
    }

    #[test]
    fn a_vector_larger_than_the_bound_is_not_kept() {
        let mut scratch = Scratch::default();
        let large = scratch.take::<f32>(Slot::Scaled, KEPT_BYTES / 4 + 1);
        scratch.put(Slot::Scaled, large);
        assert_eq!(scratch.take::<f32>(Slot::Scaled, 1).len(), 1);
    }
}
