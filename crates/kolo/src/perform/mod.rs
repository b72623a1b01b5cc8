//! Performing agreed responses on the backend, one dtype at a time
//! (`T` is chosen by the background thread's dtype dispatch).
//!
//! Every rank calls the same collective with the same sizes whether or not
//! it submitted the tensor: a rank that joined contributes the reduce op's
//! identity (allreduce, reduce-scatter), zero rows (allgather, alltoall) or
//! a placeholder to receive into (broadcast), and its result is dropped.

mod device;
mod gather;
mod reduce;

use kolo_protocol::Device;

use crate::background::ParamsOf;
use crate::table::Entry;

/// The device of this rank's tensors in a response (CPU for a rank that
/// submitted none of them).
fn device_of(slots: &[Option<Entry>], params: ParamsOf<'_>) -> Device {
    slots
        .iter()
        .flatten()
        .find_map(|e| params.of(e).map(|p| p.device))
        .unwrap_or(Device::Cpu)
}
