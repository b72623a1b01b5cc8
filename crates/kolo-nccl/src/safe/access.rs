//! How an operation on [`CudaRef`] / [`CudaMut`] views reaches their
//! memory: [`Accesses`] resolves each view to a [`Raw`] buffer on the
//! communication stream (its address, checked to be on the
//! communicator's device), ordering the stream after the source's last
//! uses first, and records the operation's use of every source when it
//! is dropped, after the operation has been enqueued. A source several
//! views of one operation share (the pieces of one buffer) is ordered and
//! recorded once, as written if any of them is.
//!
//! The [`Raw`] buffers are what the safe operations of
//! [`NcclComm`](crate::NcclComm) take (cudarc's `DevicePtr` /
//! `DevicePtrMut`, adding no tracking of their own); they never leave this
//! crate.

use crate::error::NcclError;
use crate::safe::comm::NcclComm;
use crate::safe::views::{CudaMut, CudaRef, ReadSource, WriteSource};
use crate::span::Span;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use kolo_transport::{Element, Topology};
use std::marker::PhantomData;
use std::sync::Arc;

/// `len` elements of `T` at `ptr`, resolved by [`Accesses`] for one
/// operation: the memory of a live view on the communicator's device.
pub(crate) struct Raw<'v, T> {
    ptr: CUdeviceptr,
    len: usize,
    home: &'v Arc<CudaStream>,
    _elem: PhantomData<T>,
}

impl<'v, T: Element> Raw<'v, T> {
    /// The address of the first element.
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The same memory as bytes (every [`Element`] is plain data).
    pub(crate) fn bytes(self) -> Raw<'v, u8> {
        Raw {
            ptr: self.ptr,
            len: self.len * std::mem::size_of::<T>(),
            home: self.home,
            _elem: PhantomData,
        }
    }
}

impl<T> DeviceSlice<T> for Raw<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.home
    }
}

/// No guard: [`Accesses`] has ordered the stream and records the use.
impl<T> DevicePtr<T> for Raw<'_, T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for Raw<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

/// What one more use of a source adds to an operation's uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Its first use.
    First,
    /// Used before in a mode that covers this one (`uses[i]`).
    Covered(usize),
    /// Read before (`uses[i]`), written now: order it as written too.
    Upgrade(usize),
}

/// The step of a use of `key` (written or not) after `uses`.
pub(crate) fn step<K: PartialEq>(
    uses: impl Iterator<Item = (K, bool)>,
    key: K,
    write: bool,
) -> Step {
    for (i, (seen, written)) in uses.enumerate() {
        if seen == key {
            return if write && !written {
                Step::Upgrade(i)
            } else {
                Step::Covered(i)
            };
        }
    }
    Step::First
}

#[derive(Clone, Copy)]
enum Source<'v> {
    Read(&'v dyn ReadSource),
    Write(&'v dyn WriteSource),
}

impl<'v> Source<'v> {
    /// The source's identity: the address of the object behind it (the
    /// same for a writable source and its read-only face).
    fn key(&self) -> *const () {
        match self {
            Source::Read(s) => (*s as *const dyn ReadSource).cast(),
            Source::Write(s) => (*s as *const dyn WriteSource).cast(),
        }
    }

    fn written(&self) -> bool {
        matches!(self, Source::Write(_))
    }

    fn home(self) -> &'v Arc<CudaStream> {
        match self {
            Source::Read(s) => s.home(),
            Source::Write(s) => s.home(),
        }
    }
}

/// The sources one operation uses, ordered on the communication stream;
/// every use is recorded when this is dropped (after the enqueue).
pub(crate) struct Accesses<'v> {
    stream: Arc<CudaStream>,
    ordinal: usize,
    rank: usize,
    /// Each source once, with its first element's address.
    uses: Vec<(Source<'v>, CUdeviceptr)>,
}

impl<'v> Accesses<'v> {
    /// Uses on `comm`'s stream (checks its health, binds its device).
    pub(crate) fn new(comm: &NcclComm) -> Result<Self, NcclError> {
        comm.check_health()?;
        comm.device().bind()?;
        Ok(Accesses {
            stream: Arc::clone(comm.stream()),
            ordinal: comm.device().ordinal(),
            rank: comm.rank(),
            uses: Vec::new(),
        })
    }

    /// `view`'s memory, to be read by the operation (`what` names the
    /// buffer in errors).
    pub(crate) fn read<T: Element>(
        &mut self,
        view: CudaRef<'v, T>,
        what: &str,
    ) -> Result<Raw<'v, T>, NcclError> {
        self.resolve(Source::Read(view.source()), view.span(), what)
    }

    /// `view`'s memory, to be written by the operation.
    pub(crate) fn write<T: Element>(
        &mut self,
        view: &'v CudaMut<'_, T>,
        what: &str,
    ) -> Result<Raw<'v, T>, NcclError> {
        self.resolve(Source::Write(view.source()), view.span(), what)
    }

    fn resolve<T: Element>(
        &mut self,
        source: Source<'v>,
        span: Span,
        what: &str,
    ) -> Result<Raw<'v, T>, NcclError> {
        let home = source.home();
        let ordinal = home.context().ordinal();
        if ordinal != self.ordinal {
            return Err(NcclError::InvalidArgument(format!(
                "{what} lives on device {ordinal}, but rank {} communicates on device {}",
                self.rank, self.ordinal
            )));
        }
        let seen = self.uses.iter().map(|(s, _)| (s.key(), s.written()));
        let base = match step(seen, source.key(), source.written()) {
            Step::Covered(i) => self.uses[i].1,
            Step::Upgrade(i) => {
                if let Source::Write(s) = source {
                    s.before_write(&self.stream);
                }
                self.uses[i].0 = source;
                self.uses[i].1
            }
            Step::First => {
                let base = match source {
                    Source::Read(s) => s.before_read(&self.stream),
                    Source::Write(s) => s.before_write(&self.stream),
                };
                self.uses.push((source, base));
                base
            }
        };
        Ok(Raw {
            ptr: span.start(base, std::mem::size_of::<T>()),
            len: span.len,
            home,
            _elem: PhantomData,
        })
    }
}

impl Drop for Accesses<'_> {
    fn drop(&mut self) {
        for (source, _) in &self.uses {
            match source {
                Source::Read(s) => s.after_read(&self.stream),
                Source::Write(s) => s.after_write(&self.stream),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_is_ordered_once_written_if_any_use_writes() {
        fn uses(list: &[(u8, bool)]) -> impl Iterator<Item = (u8, bool)> + '_ {
            list.iter().copied()
        }
        assert_eq!(step(uses(&[]), 1, false), Step::First);
        assert_eq!(step(uses(&[(1, false)]), 2, true), Step::First);
        assert_eq!(
            step(uses(&[(1, false), (2, true)]), 2, false),
            Step::Covered(1)
        );
        assert_eq!(
            step(uses(&[(1, false), (2, true)]), 2, true),
            Step::Covered(1)
        );
        assert_eq!(step(uses(&[(1, false)]), 1, false), Step::Covered(0));
        assert_eq!(
            step(uses(&[(3, true), (1, false)]), 1, true),
            Step::Upgrade(1)
        );
    }
}
