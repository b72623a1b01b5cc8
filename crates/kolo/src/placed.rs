//! What the collectives take: a tensor in host memory or, with the `nccl`
//! feature, in the memory of the engine's GPU. Every call takes both, so
//! that `kolo.allreduce("grad", &mut grad, Sum)` reads the same whether
//! `grad` is a `Vec<f32>` or a `CudaSlice<f32>`; where the memory decides
//! the result's type (allgather, alltoall), the input names it.
//!
//! The traits are sealed: the memory kinds are kolo's to add, since each
//! needs a performer in the engine.

use crate::tensor::{Tensor, TensorMut};
use kolo_transport::Element;

pub(crate) mod sealed {
    /// Keeps [`super::IntoTensorMut`] and [`super::IntoTensor`] to kolo's
    /// memory kinds.
    pub trait Sealed {}
}

/// A tensor an operation writes in place: the buffer of an allreduce or a
/// broadcast, the output of a reduce-scatter.
///
/// Host memory: `&mut [T]`, `&mut Vec<T>`, `&mut [T; N]`, `&mut &mut [T]`
/// and [`TensorMut`] (a buffer with a shape). With the `nccl` feature,
/// memory of the engine's GPU: `&mut CudaSlice<T>`, `CudaViewMut<T>` and
/// [`DeviceTensorMut`](crate::nccl::DeviceTensorMut).
pub trait IntoTensorMut<'a>: sealed::Sealed + Sized {
    /// The element type.
    type Elem: Element;

    /// The tensor and where it lives.
    #[doc(hidden)]
    fn placed(self) -> PlacedMut<'a, Self::Elem>;
}

/// A tensor an operation reads: the input of an allgather, an alltoall or
/// a reduce-scatter.
///
/// Host memory: `&[T]`, `&Vec<T>`, `&[T; N]` and [`Tensor`] (a buffer
/// with a shape), whose results are host memory too. With the `nccl`
/// feature, memory of the engine's GPU: `&CudaSlice<T>`, `CudaView<T>`
/// and [`DeviceTensor`](crate::nccl::DeviceTensor), whose results the
/// engine allocates on its GPU.
pub trait IntoTensor<'a>: sealed::Sealed + Sized {
    /// The element type.
    type Elem: Element;
    /// What an allgather of it returns: `Vec<T>`, or a `CudaSlice<T>`.
    type Gathered: Send + 'static;
    /// What an alltoall of it returns: [`Received<T>`], or a
    /// [`DeviceReceived<T>`](crate::nccl::DeviceReceived).
    type Received: Send + 'static;

    /// The tensor and where it lives.
    #[doc(hidden)]
    fn placed(self) -> Placed<'a, Self::Elem>;
}

/// What an alltoall delivered to this rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Received<T> {
    /// Every peer's rows for this rank, in peer order.
    pub data: Vec<T>,
    /// How many rows came from each peer, in peer order.
    pub splits: Vec<usize>,
}

/// A writable tensor and the memory it lives in.
#[doc(hidden)]
#[derive(Debug)]
pub enum PlacedMut<'a, T> {
    /// Host memory.
    Host(TensorMut<'a, T>),
    /// Memory of the engine's GPU.
    #[cfg(feature = "nccl")]
    Device(crate::device_tensor::DeviceTensorMut<'a, T>),
}

/// A read-only tensor and the memory it lives in.
#[doc(hidden)]
#[derive(Debug)]
pub enum Placed<'a, T> {
    /// Host memory.
    Host(Tensor<'a, T>),
    /// Memory of the engine's GPU.
    #[cfg(feature = "nccl")]
    Device(crate::device_tensor::DeviceTensor<'a, T>),
}

impl<'a, T> PlacedMut<'a, T> {
    /// The same tensor for a shorter borrow (the scope of a call).
    pub(crate) fn shorten<'b>(self) -> PlacedMut<'b, T>
    where
        'a: 'b,
    {
        self
    }

    /// The name of its memory, for errors.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn memory(&self) -> &'static str {
        match self {
            PlacedMut::Host(_) => "host memory",
            #[cfg(feature = "nccl")]
            PlacedMut::Device(_) => "GPU memory",
        }
    }
}

impl<'a, T> Placed<'a, T> {
    /// The same tensor for a shorter borrow (the scope of a call).
    pub(crate) fn shorten<'b>(self) -> Placed<'b, T>
    where
        'a: 'b,
    {
        self
    }

    /// The name of its memory, for errors.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn memory(&self) -> &'static str {
        match self {
            Placed::Host(_) => "host memory",
            #[cfg(feature = "nccl")]
            Placed::Device(_) => "GPU memory",
        }
    }
}

/// Host memory in place: anything that is a [`TensorMut`].
macro_rules! host_mut {
    ($($ty:ty),* $(,)?) => {$(
        impl<'a, T: Element> sealed::Sealed for $ty {}
        impl<'a, T: Element> IntoTensorMut<'a> for $ty {
            type Elem = T;
            #[inline]
            fn placed(self) -> PlacedMut<'a, T> {
                PlacedMut::Host(self.into())
            }
        }
    )*};
}

host_mut!(&'a mut [T], &'a mut Vec<T>, TensorMut<'a, T>);

impl<T: Element, const N: usize> sealed::Sealed for &mut [T; N] {}
impl<'a, T: Element, const N: usize> IntoTensorMut<'a> for &'a mut [T; N] {
    type Elem = T;
    #[inline]
    fn placed(self) -> PlacedMut<'a, T> {
        PlacedMut::Host(self.into())
    }
}

impl<T: Element> sealed::Sealed for &mut &mut [T] {}
/// An element of `&mut [&mut [T]]`, as a list of buffers gives them.
impl<'a, 'b: 'a, T: Element> IntoTensorMut<'a> for &'a mut &'b mut [T] {
    type Elem = T;
    #[inline]
    fn placed(self) -> PlacedMut<'a, T> {
        PlacedMut::Host((&mut **self).into())
    }
}

/// Host memory read: anything that is a [`Tensor`].
macro_rules! host_ref {
    ($($ty:ty),* $(,)?) => {$(
        impl<'a, T: Element> sealed::Sealed for $ty {}
        impl<'a, T: Element> IntoTensor<'a> for $ty {
            type Elem = T;
            type Gathered = Vec<T>;
            type Received = Received<T>;
            #[inline]
            fn placed(self) -> Placed<'a, T> {
                Placed::Host(self.into())
            }
        }
    )*};
}

host_ref!(&'a [T], &'a Vec<T>, Tensor<'a, T>);

impl<T: Element, const N: usize> sealed::Sealed for &[T; N] {}
impl<'a, T: Element, const N: usize> IntoTensor<'a> for &'a [T; N] {
    type Elem = T;
    type Gathered = Vec<T>;
    type Received = Received<T>;
    #[inline]
    fn placed(self) -> Placed<'a, T> {
        Placed::Host(self.into())
    }
}

#[cfg(feature = "nccl")]
mod device {
    use super::{sealed, IntoTensor, IntoTensorMut, Placed, PlacedMut};
    use crate::device_tensor::{DeviceReceived, DeviceTensor, DeviceTensorMut};
    use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
    use kolo_transport::Element;

    /// GPU memory in place: anything that is a [`DeviceTensorMut`].
    macro_rules! device_mut {
        ($($ty:ty),* $(,)?) => {$(
            impl<'a, T: Element> sealed::Sealed for $ty {}
            impl<'a, T: Element> IntoTensorMut<'a> for $ty {
                type Elem = T;
                #[inline]
                fn placed(self) -> PlacedMut<'a, T> {
                    PlacedMut::Device(self.into())
                }
            }
        )*};
    }

    device_mut!(
        &'a mut CudaSlice<T>,
        CudaViewMut<'a, T>,
        DeviceTensorMut<'a, T>
    );

    /// GPU memory read: anything that is a [`DeviceTensor`]; its results are
    /// allocated on the engine's GPU.
    macro_rules! device_ref {
        ($($ty:ty),* $(,)?) => {$(
            impl<'a, T: Element> sealed::Sealed for $ty {}
            impl<'a, T: Element> IntoTensor<'a> for $ty {
                type Elem = T;
                type Gathered = CudaSlice<T>;
                type Received = DeviceReceived<T>;
                #[inline]
                fn placed(self) -> Placed<'a, T> {
                    Placed::Device(self.into())
                }
            }
        )*};
    }

    device_ref!(&'a CudaSlice<T>, CudaView<'a, T>, DeviceTensor<'a, T>);
}
