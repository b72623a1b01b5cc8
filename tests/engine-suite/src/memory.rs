//! Where a case's tensors live. The cases written over a [`Memory`]
//! ([`crate::any_order_any_style_in`], [`crate::group_after_cache_reuse_in`],
//! [`crate::refused_tensor_alone_is_untouched_in`]) run on host memory in
//! every job ([`Host`]), and on the memory of the engine's GPU in the GPU
//! engine's test binary (`crates/kolo/tests/gpu_engine`), which
//! implements [`Memory`] over cudarc buffers: the same submissions,
//! orders, groups and refusals, checked the same way, on either memory.

use kolo::{IntoTensorMut, TensorMut};

/// A memory the collectives take `f32` tensors in.
pub trait Memory {
    /// A buffer of `f32`s in this memory.
    type Buf: Send;
    /// A writable view of a buffer, as the collectives take it.
    type View<'a>: IntoTensorMut<'a, Elem = f32> + Send
    where
        Self: 'a;

    /// The memory's name in messages ("host", "cuda:0").
    fn name(&self) -> String;
    /// A buffer holding `data`.
    fn upload(&self, data: &[f32]) -> Self::Buf;
    /// What `buf` holds (once every operation on it completed).
    fn download(&self, buf: &Self::Buf) -> Vec<f32>;
    /// The number of elements of `buf`.
    fn len(&self, buf: &Self::Buf) -> usize;
    /// All of `buf`, flat, or with `shape`.
    fn view<'a>(&self, buf: &'a mut Self::Buf, shape: Option<&[usize]>) -> Self::View<'a>;
}

/// Host memory: `Vec<f32>`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Host;

impl Memory for Host {
    type Buf = Vec<f32>;
    type View<'a> = TensorMut<'a, f32>;

    fn name(&self) -> String {
        "host".into()
    }

    fn upload(&self, data: &[f32]) -> Vec<f32> {
        data.to_vec()
    }

    fn download(&self, buf: &Vec<f32>) -> Vec<f32> {
        buf.clone()
    }

    fn len(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }

    fn view<'a>(&self, buf: &'a mut Vec<f32>, shape: Option<&[usize]>) -> TensorMut<'a, f32> {
        match shape {
            Some(shape) => TensorMut::with_shape(buf, shape),
            None => TensorMut::from(buf),
        }
    }
}
