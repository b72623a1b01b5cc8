//! kolo-fusion — CONTRACT STUB (the fusion work replaces the bodies; the
//! facade codes against these signatures).

use kolo_protocol::{Device, Response};
use kolo_transport::Element;

/// Fuses ready responses (in agreed order, one tensor each) into fewer
/// responses: allreduces with the same dtype, reduce op, scale factors and
/// devices join up to `threshold_bytes` (0 disables fusion), looking past
/// responses that cannot join; allgathers and reduce-scatters fuse where it
/// pays. Pure and deterministic: every rank computes the same plan.
pub fn plan(_responses: Vec<Response>, _threshold_bytes: usize) -> Vec<Response> {
    unimplemented!("fusion work")
}

/// Persistent fusion buffers, one per (device, dtype), allocated on first
/// use and grown when a larger fused response comes.
#[derive(Default)]
pub struct FusionBuffers {
    _private: (),
}

impl FusionBuffers {
    pub fn new() -> Self {
        Self::default()
    }

    /// A host buffer of exactly `len` elements for `device` (contents
    /// unspecified but valid values of `T`).
    pub fn get<T: Element>(&mut self, _device: Device, _len: usize) -> &mut [T] {
        unimplemented!("fusion work")
    }
}

/// Copies `srcs` one after another into `dst` (parallel for large inputs).
pub fn pack<T: Element>(_dst: &mut [T], _srcs: &[&[T]]) {
    unimplemented!("fusion work")
}

/// Copies consecutive pieces of `src` into `dsts` (parallel for large
/// outputs).
pub fn unpack<T: Element>(_src: &[T], _dsts: &mut [&mut [T]]) {
    unimplemented!("fusion work")
}
