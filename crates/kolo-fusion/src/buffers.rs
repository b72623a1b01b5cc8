//! Persistent fusion buffers, one per (device, dtype).

use kolo_protocol::{DataType, Device};
use kolo_transport::Element;
use std::any::Any;
use std::collections::HashMap;

/// One typed buffer behind `Any`, with its size in bytes.
struct Slot {
    /// A `Vec<T>` whose `T::DTYPE` is the key's dtype.
    data: Box<dyn Any + Send>,
    bytes: usize,
}

impl Slot {
    fn empty<T: Element>() -> Self {
        Slot {
            data: Box::new(Vec::<T>::new()),
            bytes: 0,
        }
    }
}

/// Persistent host fusion buffers, one per (device, dtype), allocated on
/// first use and grown (never shrunk) when a larger fused response comes.
///
/// The engine keeps one of these for its lifetime, so steady-state training
/// allocates nothing per step.
#[derive(Default)]
pub struct FusionBuffers {
    buffers: HashMap<(Device, DataType), Slot>,
    bytes: usize,
}

impl std::fmt::Debug for FusionBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sizes: Vec<_> = self
            .buffers
            .iter()
            .map(|(key, slot)| (*key, slot.bytes))
            .collect();
        sizes.sort();
        f.debug_struct("FusionBuffers")
            .field("buffers", &sizes)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl FusionBuffers {
    /// No buffers yet; nothing is allocated until the first [`get`](Self::get).
    pub fn new() -> Self {
        Self::default()
    }

    /// The buffer for `device` and `T`, at least `len` elements long: grown
    /// with `T::default()` when shorter.
    fn buffer<T: Element>(&mut self, device: Device, len: usize) -> &mut Vec<T> {
        let slot = self
            .buffers
            .entry((device, T::DTYPE))
            .or_insert_with(Slot::empty::<T>);
        if !slot.data.is::<Vec<T>>() {
            // Two element types that claim one dtype: the newest one wins.
            self.bytes -= slot.bytes;
            *slot = Slot::empty::<T>();
        }
        let vec = match slot.data.downcast_mut::<Vec<T>>() {
            Some(vec) => vec,
            None => unreachable!("the slot was just checked or replaced to hold a Vec<T>"),
        };
        if vec.len() < len {
            let grown = (len - vec.len()) * std::mem::size_of::<T>();
            vec.resize(len, T::default());
            slot.bytes += grown;
            self.bytes += grown;
        }
        vec
    }

    /// A host buffer of exactly `len` elements for `device` (contents
    /// unspecified but valid values of `T`).
    pub fn get<T: Element>(&mut self, device: Device, len: usize) -> &mut [T] {
        &mut self.buffer::<T>(device, len)[..len]
    }

    /// Two disjoint pieces of the buffer for `device`, `first` and `second`
    /// elements long: the send and receive buffers of a fused collective
    /// whose backend cannot work in place (allgatherv, reduce-scatter).
    pub fn get_pair<T: Element>(
        &mut self,
        device: Device,
        first: usize,
        second: usize,
    ) -> (&mut [T], &mut [T]) {
        let len = first.saturating_add(second);
        self.buffer::<T>(device, len)[..len].split_at_mut(first)
    }

    /// Bytes held by all buffers together.
    pub fn bytes_allocated(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_never_shrinks() {
        let mut bufs = FusionBuffers::new();
        assert_eq!(bufs.bytes_allocated(), 0);
        assert_eq!(bufs.get::<i64>(Device::Cpu, 4).len(), 4);
        assert_eq!(bufs.bytes_allocated(), 4 * 8);
        bufs.get::<i64>(Device::Cpu, 10)[9] = 7;
        assert_eq!(bufs.bytes_allocated(), 10 * 8);
        assert_eq!(bufs.get::<i64>(Device::Cpu, 2).len(), 2);
        assert_eq!(bufs.bytes_allocated(), 10 * 8);
        assert_eq!(bufs.get::<i64>(Device::Cpu, 10)[9], 7);
    }

    #[test]
    fn one_buffer_per_device_and_dtype() {
        let mut bufs = FusionBuffers::new();
        bufs.get::<i64>(Device::Cpu, 3);
        bufs.get::<i64>(Device::Cuda(1), 5);
        assert_eq!(bufs.bytes_allocated(), 8 * 8);
        bufs.get::<f32>(Device::Cpu, 4);
        assert_eq!(bufs.bytes_allocated(), 8 * 8 + 4 * 4);
        assert_eq!(bufs.get::<i64>(Device::Cpu, 3).len(), 3);
    }

    #[test]
    fn pair_is_disjoint_and_sized() {
        let mut bufs = FusionBuffers::new();
        let (a, b) = bufs.get_pair::<i64>(Device::Cpu, 3, 5);
        assert_eq!((a.len(), b.len()), (3, 5));
        a.fill(1);
        b.fill(2);
        assert_eq!(bufs.get::<i64>(Device::Cpu, 8)[..4], [1, 1, 1, 2]);
    }
}
