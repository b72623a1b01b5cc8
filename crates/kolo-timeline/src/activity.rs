//! Names of the activities recorded inside an operation's span.
//!
//! They follow Horovod's timeline vocabulary so that traces from either look
//! alike. Any other `&str` works too; these constants only spare typos.

/// Waiting in the tensor queue before the background thread picks it up.
pub const QUEUE: &str = "QUEUE";
/// Allocating (or growing) the persistent fusion buffer.
pub const INIT_FUSION_BUFFER: &str = "INIT_FUSION_BUFFER";
/// Waiting until the tensor's data is ready (e.g. a CUDA event).
pub const WAIT_FOR_DATA: &str = "WAIT_FOR_DATA";
/// Waiting for the data of other tensors of the same fused response.
pub const WAIT_FOR_OTHER_TENSOR_DATA: &str = "WAIT_FOR_OTHER_TENSOR_DATA";
/// Allocating the output of an allgather / alltoall.
pub const ALLOCATE_OUTPUT: &str = "ALLOCATE_OUTPUT";
/// Copying the tensor into the fusion buffer.
pub const MEMCPY_IN_FUSION_BUFFER: &str = "MEMCPY_IN_FUSION_BUFFER";
/// Copying the tensor out of the fusion buffer.
pub const MEMCPY_OUT_FUSION_BUFFER: &str = "MEMCPY_OUT_FUSION_BUFFER";
/// Staging device data in a host buffer.
pub const MEMCPY_IN_HOST_BUFFER: &str = "MEMCPY_IN_HOST_BUFFER";
/// Copying staged host data back to the device.
pub const MEMCPY_OUT_HOST_BUFFER: &str = "MEMCPY_OUT_HOST_BUFFER";
/// Compressing (e.g. casting to fp16) before the collective.
pub const COMPRESS: &str = "COMPRESS";
/// Decompressing after the collective.
pub const DECOMPRESS: &str = "DECOMPRESS";
/// The allreduce collective itself.
pub const ALLREDUCE: &str = "ALLREDUCE";
/// The allgather collective itself.
pub const ALLGATHER: &str = "ALLGATHER";
/// The broadcast collective itself.
pub const BROADCAST: &str = "BROADCAST";
/// The reduce-scatter collective itself.
pub const REDUCESCATTER: &str = "REDUCESCATTER";
/// The alltoall collective itself.
pub const ALLTOALL: &str = "ALLTOALL";
