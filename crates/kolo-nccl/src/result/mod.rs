//! One thin function per C call, in cudarc's `result` style: the status
//! code becomes a [`Result`] here and goes no further.
//!
//! - [`nccl`]: the NCCL functions of [`crate::sys`]; those taking device
//!   pointers or a communicator stay `unsafe`, and only
//!   [`crate::safe`]'s raw communicator calls them with a handle.
//! - [`driver`]: the few CUDA driver calls cudarc's own `result` layer does
//!   not wrap (peer access, memory pools, PTX modules, probing libcuda).
//!   Everything else on the CUDA side goes through cudarc.

pub(crate) mod driver;
pub(crate) mod nccl;
