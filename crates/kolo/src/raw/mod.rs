//! Collectives on tensors given by address: the API under framework
//! bindings (kolo-capi's C ABI, the Python package), whose tensors are
//! owned by someone else (a C caller, numpy, PyTorch) and live longer
//! than any Rust borrow can say.
//!
//! A [`RawTensor`] describes the memory (address, data type, shape, host
//! or CUDA with the caller's stream) and is checked when made; the
//! `Kolo::*_raw` calls are `unsafe`, since only the caller can vouch that
//! the memory stays valid and untouched until the operation completed,
//! and return a [`RawHandle`] that nothing ties to a scope: wait on it,
//! poll it, or hand it a callback ([`RawHandle::on_complete`]). They go
//! through the same engine as the typed calls — host allreduces in place
//! with no copy, fused with whatever else is ready, device tensors through
//! the GPU engine after their stream's work.
//!
//! ```
//! use kolo::raw::{RawMemory, RawTensor};
//! use kolo::{DataType, ReduceOp};
//!
//! kolo::threads::run(2, kolo::Config::default(), |kolo| {
//!     let mut grad = vec![kolo.rank() as f32 + 1.0; 8];
//!     let tensor = RawTensor::new(
//!         "grad",
//!         grad.as_mut_ptr().cast(),
//!         DataType::F32,
//!         &[2, 4],
//!         RawMemory::Host,
//!     )?;
//!     // SAFETY: `grad` lives, untouched, until the handle is waited for.
//!     let handle = unsafe { kolo.allreduce_raw("grad", &tensor, ReduceOp::Sum)? };
//!     handle.wait()?;
//!     assert_eq!(grad, [3.0; 8]);
//!     Ok(())
//! })?;
//! # Ok::<(), kolo::Error>(())
//! ```

mod callbacks;
#[cfg(feature = "nccl")]
mod device;
mod handle;
mod ops;
mod tensor;
#[cfg(test)]
mod tests;

pub use handle::{RawHandle, RawOutput};
pub use tensor::{RawMemory, RawTensor};
