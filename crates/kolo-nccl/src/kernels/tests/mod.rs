//! The kernels' checks without a GPU: the PTX text's structure, the copy
//! table's planning and layout, and what each kernel computes, by running
//! it on [`interp`], a small interpreter of the PTX instructions the
//! kernels use. Compiled only for `cargo test`; the same kernels run on a
//! GPU in the crate's `gpu_threads` / `gpu_mpi` test binaries.

mod allreduce_ptx;
mod copy_ptx;
mod interp;
mod scale_ptx;
