//! [`CudaRef`] and [`CudaMut`]: the views of CUDA memory kolo's generic
//! data plane works on ([`crate::Cuda`]'s `Ref` and `Mut`), like `&[T]`
//! and `&mut [T]` on the host.
//!
//! A view is a range (offset and length, in elements) of a *source*: the
//! cudarc buffer it borrows (a `CudaSlice`, a `CudaView` or `CudaViewMut`,
//! an [`Untracked`] buffer). Splitting and reborrowing are arithmetic on
//! the range; the source keeps the buffer borrowed, and with it cudarc's
//! per-buffer events. Operations reach the memory only through
//! [`crate::safe::access`], which orders the communication stream after
//! each source's last uses before the operation is enqueued and records
//! the operation's use after it, as cudarc's own `device_ptr` guards do.
//!
//! The pieces of one writable view share their source (one cudarc view
//! behind a lock, as cudarc needs `&mut` to record a write); the lock is
//! held only while an event is waited for or recorded.

use crate::safe::untracked::Untracked;
use crate::span::Span;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice,
};
use kolo_transport::Element;
use parking_lot::Mutex;
use std::marker::PhantomData;
use std::sync::Arc;

/// Memory a read-only view borrows, with its cudarc event tracking.
pub(crate) trait ReadSource: Send + Sync {
    /// The stream the memory was allocated on (its device).
    fn home(&self) -> &Arc<CudaStream>;
    /// `stream` waits, on the GPU, for the memory's last write; returns
    /// the address of its first element.
    fn before_read(&self, stream: &CudaStream) -> CUdeviceptr;
    /// Records a read on `stream` (enqueued by now) for later writers.
    fn after_read(&self, stream: &CudaStream);
}

/// Memory a writable view borrows.
pub(crate) trait WriteSource: ReadSource {
    /// `stream` waits, on the GPU, for the memory's last reads and write;
    /// returns the address of its first element.
    fn before_write(&self, stream: &CudaStream) -> CUdeviceptr;
    /// Records a write on `stream` (enqueued by now) for later users.
    fn after_write(&self, stream: &CudaStream);
    /// The same source, read-only (what a frozen view reads through).
    fn as_read(&self) -> &dyn ReadSource;
}

/// cudarc's read protocol on a `DevicePtr`: the guard records the read
/// when dropped; `forget` skips that (the wait has happened).
fn read_protocol<T>(buf: &impl DevicePtr<T>, stream: &CudaStream, record: bool) -> CUdeviceptr {
    let (ptr, guard) = buf.device_ptr(stream);
    if !record {
        // The guard holds references only: forgetting it leaks nothing.
        std::mem::forget(guard);
    }
    ptr
}

/// cudarc's write protocol on a `DevicePtrMut`, as [`read_protocol`].
fn write_protocol<T>(
    buf: &mut impl DevicePtrMut<T>,
    stream: &CudaStream,
    record: bool,
) -> CUdeviceptr {
    let (ptr, guard) = buf.device_ptr_mut(stream);
    if !record {
        std::mem::forget(guard);
    }
    ptr
}

impl<T: Element> ReadSource for CudaSlice<T> {
    fn home(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(self)
    }
    fn before_read(&self, stream: &CudaStream) -> CUdeviceptr {
        read_protocol(self, stream, false)
    }
    fn after_read(&self, stream: &CudaStream) {
        read_protocol(self, stream, true);
    }
}

impl<T: Element> ReadSource for CudaView<'_, T> {
    fn home(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(self)
    }
    fn before_read(&self, stream: &CudaStream) -> CUdeviceptr {
        read_protocol(self, stream, false)
    }
    fn after_read(&self, stream: &CudaStream) {
        read_protocol(self, stream, true);
    }
}

/// [`Untracked`] memory: the caller orders its uses, nothing is tracked.
impl<T: Element> ReadSource for Untracked<T> {
    fn home(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(self)
    }
    fn before_read(&self, stream: &CudaStream) -> CUdeviceptr {
        read_protocol(self, stream, false)
    }
    fn after_read(&self, _stream: &CudaStream) {}
}

/// A writable cudarc view shared by the pieces of one [`CudaMut`].
struct Shared<'a, T> {
    view: Mutex<CudaViewMut<'a, T>>,
    home: Arc<CudaStream>,
}

impl<T: Element> ReadSource for Shared<'_, T> {
    fn home(&self) -> &Arc<CudaStream> {
        &self.home
    }
    fn before_read(&self, stream: &CudaStream) -> CUdeviceptr {
        read_protocol(&*self.view.lock(), stream, false)
    }
    fn after_read(&self, stream: &CudaStream) {
        read_protocol(&*self.view.lock(), stream, true);
    }
}

impl<T: Element> WriteSource for Shared<'_, T> {
    fn before_write(&self, stream: &CudaStream) -> CUdeviceptr {
        write_protocol(&mut *self.view.lock(), stream, false)
    }
    fn after_write(&self, stream: &CudaStream) {
        write_protocol(&mut *self.view.lock(), stream, true);
    }
    fn as_read(&self) -> &dyn ReadSource {
        self
    }
}

/// Writable [`Untracked`] memory.
struct UntrackedMut<'a, T>(&'a Untracked<T>);

impl<T: Element> ReadSource for UntrackedMut<'_, T> {
    fn home(&self) -> &Arc<CudaStream> {
        self.0.home()
    }
    fn before_read(&self, stream: &CudaStream) -> CUdeviceptr {
        self.0.before_read(stream)
    }
    fn after_read(&self, _stream: &CudaStream) {}
}

impl<T: Element> WriteSource for UntrackedMut<'_, T> {
    fn before_write(&self, stream: &CudaStream) -> CUdeviceptr {
        // No tracking: the address is all there is to get.
        self.0.before_read(stream)
    }
    fn after_write(&self, _stream: &CudaStream) {}
    fn as_read(&self) -> &dyn ReadSource {
        self
    }
}

/// A read-only view of `len` elements of `T` in CUDA memory: `&[T]` on
/// the device, [`crate::Cuda`]'s `Ref`. Cheap to copy; borrows the cudarc
/// buffer it was made from, whose event tracking every operation on the
/// view takes part in.
pub struct CudaRef<'a, T> {
    source: &'a dyn ReadSource,
    span: Span,
    _elem: PhantomData<&'a [T]>,
}

impl<T> Clone for CudaRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for CudaRef<'_, T> {}

impl<T: Element> std::fmt::Debug for CudaRef<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRef")
            .field("dtype", &T::DTYPE)
            .field("offset", &self.span.offset)
            .field("len", &self.span.len)
            .finish()
    }
}

impl<'a, T: Element> CudaRef<'a, T> {
    fn over(source: &'a dyn ReadSource, span: Span) -> Self {
        CudaRef {
            source,
            span,
            _elem: PhantomData,
        }
    }

    /// All of `buf`.
    pub fn new(buf: &'a CudaSlice<T>) -> Self {
        Self::over(buf, Span::whole(buf.len()))
    }

    /// All of `view`.
    pub fn from_view(view: &'a CudaView<'_, T>) -> Self {
        Self::over(view, Span::whole(view.len()))
    }

    /// All of `buf`, without event tracking (the caller orders its uses,
    /// see [`Untracked`]).
    pub fn untracked(buf: &'a Untracked<T>) -> Self {
        Self::over(buf, Span::whole(DeviceSlice::len(buf)))
    }

    /// The first `len` elements of `buf` (a buffer whose allocation is
    /// longer than its contents).
    pub(crate) fn prefix(buf: &'a CudaSlice<T>, len: usize) -> Self {
        Self::over(buf, Span::whole(len.min(buf.len())))
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.span.len
    }

    /// True when the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.span.len == 0
    }

    /// The first `at` elements and the rest (`at` at most the length).
    pub fn split_at(self, at: usize) -> (Self, Self) {
        let (head, tail) = self.span.split_at(at);
        (Self::over(self.source, head), Self::over(self.source, tail))
    }

    pub(crate) fn source(&self) -> &'a dyn ReadSource {
        self.source
    }

    /// `span` of `source` (see [`crate::UntrackedSpace`]).
    pub(crate) fn borrowing(source: &'a dyn ReadSource, span: Span) -> Self {
        Self::over(source, span)
    }

    pub(crate) fn span(&self) -> Span {
        self.span
    }
}

impl<'a, T: Element> From<&'a CudaSlice<T>> for CudaRef<'a, T> {
    fn from(buf: &'a CudaSlice<T>) -> Self {
        CudaRef::new(buf)
    }
}

/// What the pieces of one writable view share: a source made for the
/// view (a cudarc view behind a lock), or one that outlives it (an
/// [`UntrackedSpace`](crate::UntrackedSpace), whose views cost no
/// allocation).
#[derive(Clone)]
enum MutSource<'a> {
    Shared(Arc<dyn WriteSource + 'a>),
    Borrowed(&'a dyn WriteSource),
}

impl MutSource<'_> {
    fn get(&self) -> &dyn WriteSource {
        match self {
            MutSource::Shared(source) => &**source,
            MutSource::Borrowed(source) => *source,
        }
    }
}

/// A writable view of `len` elements of `T` in CUDA memory: `&mut [T]` on
/// the device, [`crate::Cuda`]'s `Mut`. Borrows its cudarc buffer
/// uniquely; [`CudaMut::split_at_mut`] cuts it into disjoint pieces that
/// share the borrow.
pub struct CudaMut<'a, T> {
    source: MutSource<'a>,
    span: Span,
    _elem: PhantomData<&'a mut [T]>,
}

impl<T: Element> std::fmt::Debug for CudaMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMut")
            .field("dtype", &T::DTYPE)
            .field("offset", &self.span.offset)
            .field("len", &self.span.len)
            .finish()
    }
}

impl<'a, T: Element> CudaMut<'a, T> {
    fn over(source: Arc<dyn WriteSource + 'a>, span: Span) -> Self {
        Self::within(MutSource::Shared(source), span)
    }

    fn within(source: MutSource<'a>, span: Span) -> Self {
        CudaMut {
            source,
            span,
            _elem: PhantomData,
        }
    }

    /// `span` of `source`, a source that outlives the view (see
    /// [`crate::UntrackedSpace`]).
    pub(crate) fn borrowing(source: &'a dyn WriteSource, span: Span) -> Self {
        Self::within(MutSource::Borrowed(source), span)
    }

    /// All of `buf`.
    pub fn new(buf: &'a mut CudaSlice<T>) -> Self {
        Self::from_view(buf.as_view_mut())
    }

    /// All of `view`.
    pub fn from_view(view: CudaViewMut<'a, T>) -> Self {
        let (home, len) = (Arc::clone(DeviceSlice::stream(&view)), view.len());
        let shared = Shared {
            view: Mutex::new(view),
            home,
        };
        Self::over(Arc::new(shared), Span::whole(len))
    }

    /// All of `buf`, without event tracking (see [`Untracked`]).
    pub fn untracked(buf: &'a mut Untracked<T>) -> Self {
        let len = DeviceSlice::len(buf);
        Self::over(Arc::new(UntrackedMut(&*buf)), Span::whole(len))
    }

    /// The first `len` elements of `buf` (see [`CudaRef::prefix`]).
    pub(crate) fn prefix(buf: &'a mut CudaSlice<T>, len: usize) -> Self {
        let len = len.min(buf.len());
        let mut whole = Self::new(buf);
        whole.span = Span::whole(len);
        whole
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.span.len
    }

    /// True when the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.span.len == 0
    }

    /// The first `at` elements and the rest, both writable (`at` at most
    /// the length).
    pub fn split_at_mut(self, at: usize) -> (Self, Self) {
        let (head, tail) = self.span.split_at(at);
        (
            Self::within(self.source.clone(), head),
            Self::within(self.source, tail),
        )
    }

    /// A read-only view of the same elements, for as long as this one is
    /// borrowed.
    pub fn freeze(&self) -> CudaRef<'_, T> {
        CudaRef::over(self.source.get().as_read(), self.span)
    }

    /// A writable view of the same elements, for as long as this one is
    /// borrowed.
    pub fn reborrow(&mut self) -> CudaMut<'_, T> {
        CudaMut::within(self.source.clone(), self.span)
    }

    pub(crate) fn source(&self) -> &dyn WriteSource {
        self.source.get()
    }

    pub(crate) fn span(&self) -> Span {
        self.span
    }
}

impl<'a, T: Element> From<&'a mut CudaSlice<T>> for CudaMut<'a, T> {
    fn from(buf: &'a mut CudaSlice<T>) -> Self {
        CudaMut::new(buf)
    }
}

impl<'a, T: Element> From<CudaViewMut<'a, T>> for CudaMut<'a, T> {
    fn from(view: CudaViewMut<'a, T>) -> Self {
        CudaMut::from_view(view)
    }
}
