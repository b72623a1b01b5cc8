//! kolo-nccl's own device code: kernels written by hand in PTX and
//! JIT-compiled by the driver when a device first needs them
//! (`cuModuleLoadDataEx`), so neither nvrtc nor nvcc is needed.
//!
//! - [`scale_ptx`] and [`scale`]: `dst = factor * src` with kolo's element
//!   semantics, for what NCCL cannot scale (see [`crate::reduce_plan`]);
//! - [`copy_ptx`] and [`batched_copy`]: many device-to-device copies in one
//!   launch over a table of rows, for the device fusion buffer;
//! - [`allreduce_ptx`] and [`peer_allreduce`]: one-shot and two-shot
//!   allreduce over every rank's registered buffer, synchronised by flags
//!   (see [`crate::crossover`] for when they run);
//! - [`module`]: a loaded PTX module, unloaded on drop.
//!
//! The `*_ptx` modules are pure text and planning, checked without a GPU
//! by `tests/` (a PTX interpreter runs the kernels against the host
//! reference); the others load and launch them on a communicator's stream.

pub(crate) mod allreduce_ptx;
pub(crate) mod allreduce_units;
pub(crate) mod batched_copy;
pub(crate) mod copy_ptx;
pub(crate) mod module;
pub(crate) mod peer_allreduce;
pub(crate) mod scale;
pub(crate) mod scale_ptx;

#[cfg(test)]
mod tests;
