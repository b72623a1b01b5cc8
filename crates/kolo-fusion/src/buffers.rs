//! Persistent fusion buffers, one per (device, dtype), in any memory,
//! within a byte budget for all of them together.

use crate::error::FusionError;
use crate::retention::{Retention, Serve};
use kolo_protocol::{DataType, Device};
use kolo_transport::{Collectives, Element, Host, Memory};
use std::any::Any;
use std::collections::HashMap;
use std::convert::Infallible;
use std::marker::PhantomData;

/// The budget of [`FusionBuffers::new`] and `default()`: twice kolo's
/// default fusion threshold (128 MiB), so that a job fusing two dtypes
/// (fp16 and fp32 gradients) keeps both buffers.
pub const DEFAULT_BUFFER_BUDGET: usize = 256 << 20;

/// Persistent fusion buffers in memory `M` (host memory unless said
/// otherwise): one per (device, dtype), allocated on first use and
/// replaced by a larger one when a larger fused response comes.
///
/// The engine keeps one of these for its lifetime, so that steady-state
/// training allocates nothing per step: a request that fits its buffer
/// reuses it. What is kept stays bounded however the requests vary (a
/// process mixing every dtype and sizes would otherwise keep each dtype's
/// largest buffer for good):
///
/// - all buffers together stay within a byte [budget](Self::with_budget):
///   allocating past it first frees the least recently used other
///   buffers (a single request larger than the budget is still served,
///   its buffer then the only one kept);
/// - at the end of every window of 64 requests or 4,096
///   [ticks](Self::tick), a buffer that served no request in that window,
///   or held more than 1.5 times the largest one it served, is freed;
/// - [`release`](Self::release) frees them all at once, for an owner
///   that empties its caches between phases of a job.
///
/// A repeated training step uses each of its buffers at full size in every
/// window, and keeps them while they fit the budget together.
///
/// Host buffers start from [`new`](Self::new), those of another memory
/// from `FusionBuffers::<M>::default()` or
/// [`with_budget`](Self::with_budget); their allocations come from the
/// backend, through [`Collectives::new_buffer`].
pub struct FusionBuffers<M: Memory = Host> {
    /// Each an `M::Owned<T>` whose `T::DTYPE` is the key's dtype. Typed
    /// rather than bytes because a [`Memory`] views only allocations of
    /// the element type it made them with.
    buffers: HashMap<(Device, DataType), Box<dyn Any + Send>>,
    /// Which of them to keep, with their sizes.
    retention: Retention<(Device, DataType)>,
    memory: PhantomData<M>,
}

impl<M: Memory> Default for FusionBuffers<M> {
    fn default() -> Self {
        Self::with_budget(DEFAULT_BUFFER_BUDGET)
    }
}

impl<M: Memory> std::fmt::Debug for FusionBuffers<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sizes: Vec<_> = self.retention.slots().collect();
        sizes.sort();
        f.debug_struct("FusionBuffers")
            .field("memory", &M::KIND)
            .field("buffers", &sizes)
            .field("bytes", &self.retention.total())
            .field("budget", &self.retention.budget())
            .finish()
    }
}

impl<M: Memory> FusionBuffers<M> {
    /// No buffers yet, to be kept within `budget` bytes together (see the
    /// type's doc). An engine passes a small multiple of its fusion
    /// threshold, the largest fused response it plans.
    pub fn with_budget(budget: usize) -> Self {
        FusionBuffers {
            buffers: HashMap::new(),
            retention: Retention::new(budget),
            memory: PhantomData,
        }
    }

    /// The byte budget of all buffers together.
    pub fn budget(&self) -> usize {
        self.retention.budget()
    }

    /// Drops the allocations of `keys`. Dropping one that queued work
    /// still uses is the memory's to order (a device memory frees in
    /// stream order).
    fn free(&mut self, keys: Vec<(Device, DataType)>) {
        for key in keys {
            self.buffers.remove(&key);
        }
    }

    /// One tick of the owner's clock (an engine calls it once a cycle):
    /// buffers that rare operations ask for are trimmed after a window of
    /// ticks, as frequent ones are after a window of requests.
    pub fn tick(&mut self) {
        let freed = self.retention.tick();
        self.free(freed);
    }

    /// The allocation for `device` and `T`, at least `len` elements long.
    /// A shorter one is dropped before `allocate` makes one of `len`
    /// elements, so that a device never holds both; so is an allocation of
    /// another element type that claims the same dtype (the newest type
    /// wins), and so are the buffers the budget or the trim give up.
    fn allocation<T: Element, E>(
        &mut self,
        device: Device,
        len: usize,
        allocate: impl FnOnce(usize) -> Result<M::Owned<T>, E>,
    ) -> Result<&mut M::Owned<T>, E> {
        let key = (device, T::DTYPE);
        let size = std::mem::size_of::<T>();
        let fits = self.buffers.get(&key).is_some_and(|data| {
            data.downcast_ref::<M::Owned<T>>()
                .is_some_and(|owned| M::owned_len(owned) >= len)
        });
        let need = len.saturating_mul(size);
        let (serve, freed) = self.retention.request(key, need, fits);
        self.free(freed);
        if serve == Serve::Allocate {
            let owned = allocate(len)?;
            let bytes = M::owned_len(&owned).saturating_mul(size);
            self.buffers.insert(key, Box::new(owned));
            let freed = self.retention.admit(key, bytes, need);
            self.free(freed);
        }
        match self
            .buffers
            .get_mut(&key)
            .and_then(|data| data.downcast_mut::<M::Owned<T>>())
        {
            Some(owned) => Ok(owned),
            None => unreachable!("the buffer was just checked or replaced to hold an M::Owned<T>"),
        }
    }

    /// A view of exactly `len` elements of the buffer for `device` and `T`
    /// (contents unspecified but valid values of `T`), allocated or grown
    /// through `comm`'s [`Collectives::new_buffer`] when shorter.
    ///
    /// Fails when the allocation fails (a [`FusionError::Transport`]
    /// error, the buffer given up) or is shorter than asked for
    /// ([`FusionError::ShortAllocation`]).
    pub fn buffer<C: Collectives<M>, T: Element>(
        &mut self,
        comm: &mut C,
        device: Device,
        len: usize,
    ) -> Result<M::Mut<'_, T>, FusionError> {
        let owned = self.allocation::<T, _>(device, len, |len| {
            let owned = comm.new_buffer::<T>(len)?;
            let allocated = M::owned_len(&owned);
            if allocated < len {
                return Err(FusionError::ShortAllocation {
                    what: "the fusion buffer".to_owned(),
                    device,
                    dtype: T::DTYPE,
                    requested: len,
                    allocated,
                });
            }
            Ok(owned)
        })?;
        Ok(M::split_at_mut(M::view_mut(owned), len).0)
    }

    /// Two disjoint pieces of the buffer for `device` and `T`, `first` and
    /// `second` elements long: the send and receive buffers of a fused
    /// collective whose backend cannot work in place (allgatherv,
    /// reduce-scatter). Fails as [`buffer`](Self::buffer) does, and with
    /// [`FusionError::BufferOverflow`] when the pieces together hold more
    /// than `usize::MAX` elements.
    #[allow(clippy::type_complexity)] // two views of M: an alias would hide which
    pub fn buffer_pair<C: Collectives<M>, T: Element>(
        &mut self,
        comm: &mut C,
        device: Device,
        first: usize,
        second: usize,
    ) -> Result<(M::Mut<'_, T>, M::Mut<'_, T>), FusionError> {
        let len = first
            .checked_add(second)
            .ok_or(FusionError::BufferOverflow {
                device,
                dtype: T::DTYPE,
                first,
                second,
            })?;
        let whole = self.buffer::<C, T>(comm, device, len)?;
        Ok(M::split_at_mut(whole, first))
    }

    /// Bytes held by all buffers together.
    pub fn bytes_allocated(&self) -> usize {
        self.retention.total()
    }

    /// Frees every buffer now, as a job empties its caches between phases
    /// (training, then evaluation): the next fused operation allocates
    /// again at the size it needs. Returns the bytes freed.
    pub fn release(&mut self) -> usize {
        let bytes = self.retention.total();
        let freed = self.retention.release_all();
        self.free(freed);
        bytes
    }
}

impl FusionBuffers<Host> {
    /// No host buffers yet, within [`DEFAULT_BUFFER_BUDGET`]; nothing is
    /// allocated until the first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// A host buffer of exactly `len` elements for `device` (contents
    /// unspecified but valid values of `T`), without a backend at hand:
    /// host memory is allocated as [`Host`]'s `new_buffer` does.
    pub fn get<T: Element>(&mut self, device: Device, len: usize) -> &mut [T] {
        let allocated =
            self.allocation::<T, Infallible>(device, len, |len| Ok(vec![T::default(); len]));
        match allocated {
            Ok(owned) => &mut owned[..len],
            Err(never) => match never {},
        }
    }

    /// Two disjoint host pieces of the buffer for `device`, `first` and
    /// `second` elements long (see [`buffer_pair`](Self::buffer_pair)).
    ///
    /// # Panics
    /// When `first + second` overflows `usize`, as allocating that many
    /// would; [`buffer_pair`](Self::buffer_pair) reports it as an error.
    pub fn get_pair<T: Element>(
        &mut self,
        device: Device,
        first: usize,
        second: usize,
    ) -> (&mut [T], &mut [T]) {
        let len = first.saturating_add(second);
        self.get::<T>(device, len).split_at_mut(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Loopback, ShortAllocator};

    #[test]
    fn grows_to_the_largest_request_and_serves_smaller_ones_from_it() {
        let mut bufs = FusionBuffers::new();
        assert_eq!(bufs.bytes_allocated(), 0);
        assert_eq!(bufs.get::<i64>(Device::Cpu, 4).len(), 4);
        assert_eq!(bufs.bytes_allocated(), 4 * 8);
        bufs.get::<i64>(Device::Cpu, 10)[9] = 7;
        assert_eq!(bufs.bytes_allocated(), 10 * 8);
        assert_eq!(bufs.get::<i64>(Device::Cpu, 3).len(), 3);
        assert_eq!(bufs.bytes_allocated(), 10 * 8);
        assert_eq!(bufs.get::<i64>(Device::Cpu, 10)[9], 7);
    }

    #[test]
    fn release_frees_every_buffer_and_the_next_request_allocates_again() {
        let mut bufs = FusionBuffers::new();
        bufs.get::<i64>(Device::Cpu, 10);
        bufs.get::<f32>(Device::Cuda(1), 4);
        assert_eq!(bufs.release(), 10 * 8 + 4 * 4);
        assert_eq!(bufs.bytes_allocated(), 0);
        assert!(bufs.buffers.is_empty());
        assert_eq!(bufs.release(), 0);
        assert_eq!(bufs.get::<i64>(Device::Cpu, 3).len(), 3);
        assert_eq!(bufs.bytes_allocated(), 3 * 8);
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
    fn a_repeated_step_reuses_its_buffers_without_allocating() {
        let mut comm = Loopback::default();
        let mut bufs = FusionBuffers::<Host>::with_budget(1 << 20);
        // One dtype, the same fused size every step.
        let first = bufs
            .buffer::<_, f32>(&mut comm, Device::Cpu, 1000)
            .unwrap()
            .as_ptr();
        for _ in 0..1000 {
            let again = bufs.buffer::<_, f32>(&mut comm, Device::Cpu, 1000).unwrap();
            assert_eq!(again.as_ptr(), first, "the step's buffer is reused");
        }
        // Two dtypes every step, the second one's size varying a little.
        let half = bufs.get::<i16>(Device::Cpu, 500).as_ptr();
        for step in 0..1000 {
            assert_eq!(bufs.get::<f32>(Device::Cpu, 1000).as_ptr(), first);
            assert_eq!(
                bufs.get::<i16>(Device::Cpu, 400 + step % 100).as_ptr(),
                half
            );
        }
        assert_eq!(bufs.bytes_allocated(), 1000 * 4 + 500 * 2);
    }

    #[test]
    fn buffers_past_the_budget_free_the_least_recently_used_first() {
        let mut bufs = FusionBuffers::with_budget(100);
        assert_eq!(bufs.budget(), 100);
        bufs.get::<f32>(Device::Cpu, 10);
        bufs.get::<i64>(Device::Cpu, 5);
        bufs.get::<f32>(Device::Cpu, 10);
        // 40 + 40 + 30 bytes do not fit 100: the i64 buffer, used less
        // recently than the f32 one, goes.
        bufs.get::<u8>(Device::Cpu, 30);
        assert_eq!(bufs.bytes_allocated(), 40 + 30);
        assert_eq!(
            format!("{bufs:?}"),
            "FusionBuffers { memory: Host, buffers: [((Cpu, U8), 30), ((Cpu, F32), 40)], \
             bytes: 70, budget: 100 }"
        );
        // A request larger than the whole budget is served, alone.
        assert_eq!(bufs.get::<f64>(Device::Cpu, 50).len(), 50);
        assert_eq!(bufs.bytes_allocated(), 50 * 8);
    }

    #[test]
    fn a_buffer_unused_or_much_larger_than_its_use_for_a_while_is_freed() {
        let mut bufs = FusionBuffers::new();
        bufs.get::<f64>(Device::Cpu, 1 << 16);
        bufs.get::<i32>(Device::Cpu, 1 << 16);
        for _ in 0..2 * crate::retention::TRIM_WINDOW {
            bufs.get::<i32>(Device::Cpu, 100);
        }
        assert_eq!(
            bufs.bytes_allocated(),
            100 * 4,
            "the idle f64 buffer is freed, the i32 one replaced by one of its use"
        );
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

    #[test]
    fn buffers_through_a_backend_grow_and_keep_their_contents_while_they_fit() {
        let mut comm = Loopback::default();
        let mut bufs = FusionBuffers::<Host>::default();
        let buf = bufs.buffer::<_, u16>(&mut comm, Device::Cpu, 6).unwrap();
        assert_eq!(buf.len(), 6);
        buf[5] = 9;
        assert_eq!(bufs.bytes_allocated(), 6 * 2);
        let (send, recv) = bufs
            .buffer_pair::<_, u16>(&mut comm, Device::Cpu, 2, 4)
            .unwrap();
        assert_eq!((send.len(), recv.len(), recv[3]), (2, 4, 9));
        let (send, recv) = bufs
            .buffer_pair::<_, u16>(&mut comm, Device::Cpu, 4, 5)
            .unwrap();
        assert_eq!((send.len(), recv.len()), (4, 5));
        assert_eq!(
            bufs.bytes_allocated(),
            9 * 2,
            "the 6-element buffer was replaced"
        );
    }

    /// An element type that claims another's dtype.
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    #[repr(transparent)]
    struct OtherI64(i64);
    // SAFETY: a transparent newtype of one `i64`: plain data, no padding,
    // no pointers.
    unsafe impl Element for OtherI64 {
        const DTYPE: DataType = DataType::I64;
        fn identity(op: kolo_protocol::ReduceOp) -> Self {
            OtherI64(i64::identity(op))
        }
        fn reduce_into(acc: &mut [Self], src: &[Self], op: kolo_protocol::ReduceOp) {
            for (a, s) in acc.iter_mut().zip(src) {
                let (mut x, y) = ([a.0], [s.0]);
                i64::reduce_into(&mut x, &y, op);
                a.0 = x[0];
            }
        }
        fn reduce_many(dst: &mut [Self], srcs: &[&[Self]], op: kolo_protocol::ReduceOp) {
            dst.fill(Self::identity(op));
            for src in srcs {
                Self::reduce_into(dst, src, op);
            }
        }
        fn scale(buf: &mut [Self], factor: f64) {
            for v in buf {
                let mut x = [v.0];
                i64::scale(&mut x, factor);
                v.0 = x[0];
            }
        }
        fn from_f64(v: f64) -> Self {
            OtherI64(i64::from_f64(v))
        }
        fn to_f64(self) -> f64 {
            self.0.to_f64()
        }
    }

    #[test]
    fn a_type_claiming_a_dtype_in_use_replaces_its_buffer_instead_of_reading_it() {
        let mut comm = Loopback::default();
        let mut bufs = FusionBuffers::new();
        bufs.buffer::<_, i64>(&mut comm, Device::Cpu, 8)
            .unwrap()
            .fill(5);
        let other = bufs
            .buffer::<_, OtherI64>(&mut comm, Device::Cpu, 2)
            .unwrap();
        assert_eq!(other, [OtherI64(0); 2], "a fresh buffer, not the i64s");
        assert_eq!(bufs.bytes_allocated(), 2 * 8, "the i64 buffer was freed");
        let back = bufs.buffer::<_, i64>(&mut comm, Device::Cpu, 1).unwrap();
        assert_eq!(back, [0]);
    }

    #[test]
    fn a_short_allocation_and_an_overflowing_pair_are_errors_naming_the_buffer() {
        let mut comm = ShortAllocator(Loopback::default());
        let mut bufs = FusionBuffers::new();
        let err = bufs
            .buffer::<_, f32>(&mut comm, Device::Cuda(2), 10)
            .unwrap_err();
        assert_eq!(
            err,
            FusionError::ShortAllocation {
                what: "the fusion buffer".to_owned(),
                device: Device::Cuda(2),
                dtype: DataType::F32,
                requested: 10,
                allocated: 9
            }
        );
        assert_eq!(bufs.bytes_allocated(), 0, "the short buffer is not kept");

        let mut comm = Loopback::default();
        let err = bufs
            .buffer_pair::<_, u8>(&mut comm, Device::Cpu, 3, usize::MAX)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "the fusion buffer of u8 on cpu: pieces of 3 and {} elements overflow usize",
                usize::MAX
            )
        );
    }
}
