//! The collectives a rank submits, each in two forms: blocking on
//! [`crate::Kolo`] (`kolo.allreduce(..)`) and asynchronous in a
//! [`crate::Scope`] (`kolo.scope(|s| s.allreduce_async(..))`); a blocking
//! call is its async form in a scope of its own, waited at once.
//!
//! Allreduces — one tensor, or a [`crate::TensorGroup`]'s — are performed
//! on the caller's buffers in place, with no copy, in either form. The
//! other collectives copy their input when submitted and write their
//! output into the caller's buffer (or hand it over) when the handle
//! completes.

mod control;
mod gather;
mod reduce;

use crate::engine::completion::Payload;
use crate::error::Error;
use kolo_protocol::{Compression, ReduceOp};

#[cfg(feature = "nccl")]
pub(crate) use reduce::my_rows;

/// How a reduction (allreduce, reduce-scatter) combines the ranks' tensors:
/// `out = postscale * op_r(prescale * in_r)`. A bare [`ReduceOp`] converts
/// into options with both factors 1.
///
/// ```
/// use kolo::{ReduceOp, ReduceOptions};
/// let halved = ReduceOptions::new(ReduceOp::Sum).postscale(0.5);
/// assert_eq!(halved.postscale, 0.5);
/// assert_eq!(ReduceOptions::from(ReduceOp::Max).prescale, 1.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReduceOptions {
    /// How elements combine. `Average` divides the sum by the number of
    /// ranks; on integer tensors (and wherever a scale factor is not 1)
    /// the factor is applied in f64 and the result rounded toward zero,
    /// saturating at the type's bounds (`3` and `4` average to `3`; i64
    /// values beyond 2^53 lose precision), so an integer average never overflows.
    pub op: ReduceOp,
    /// Factor applied to every rank's input before the reduction.
    pub prescale: f64,
    /// Factor applied to the result.
    pub postscale: f64,
    /// How an allreduce's `f32` and `f64` data travel (Horovod's
    /// `Compression`): [`Compression::Fp16`] and [`Compression::Bf16`]
    /// cast them to 16 bits in the fusion buffer, halving the bytes moved,
    /// and back after the collective; the result is the reduction of the
    /// rounded values in that type's precision. Every rank must give the
    /// same (a mismatch fails the tensor on every rank, naming both).
    /// Other data types, and reduce-scatters, travel as they are; device
    /// tensors refuse a compression.
    pub compression: Compression,
}

impl ReduceOptions {
    /// `op` with both factors 1.
    pub fn new(op: ReduceOp) -> Self {
        ReduceOptions {
            op,
            prescale: 1.0,
            postscale: 1.0,
            compression: Compression::None,
        }
    }

    /// Sets the factor applied to the inputs.
    pub fn prescale(mut self, factor: f64) -> Self {
        self.prescale = factor;
        self
    }

    /// Sets the factor applied to the result.
    pub fn postscale(mut self, factor: f64) -> Self {
        self.postscale = factor;
        self
    }

    /// Sets how an allreduce's floating-point data travel (see
    /// [`ReduceOptions::compression`]).
    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }
}

impl Default for ReduceOptions {
    fn default() -> Self {
        ReduceOptions::new(ReduceOp::Sum)
    }
}

impl From<ReduceOp> for ReduceOptions {
    fn from(op: ReduceOp) -> Self {
        ReduceOptions::new(op)
    }
}

/// Fails with the problem of a tensor view, if it has one.
fn check(tensor: &str, problem: Option<String>) -> Result<(), Error> {
    match problem {
        None => Ok(()),
        Some(reason) => Err(Error::InvalidArgument {
            tensor: tensor.to_owned(),
            reason,
        }),
    }
}

/// The engine's output for `tensor`, of type `O`.
fn output<O: 'static>(tensor: &str, payload: Option<Payload>) -> Result<O, Error> {
    payload
        .and_then(|p| p.downcast::<O>().ok())
        .map(|boxed| *boxed)
        .ok_or_else(|| Error::Collective {
            tensor: tensor.to_owned(),
            message: "internal: the engine returned an output of another type".into(),
        })
}

/// Copies the engine's result into the caller's buffer.
fn write_back<T: Copy>(tensor: &str, dst: &mut [T], src: &[T]) -> Result<(), Error> {
    if dst.len() != src.len() {
        return Err(Error::Collective {
            tensor: tensor.to_owned(),
            message: format!(
                "internal: the result has {} elements, the buffer {}",
                src.len(),
                dst.len()
            ),
        });
    }
    dst.copy_from_slice(src);
    Ok(())
}
