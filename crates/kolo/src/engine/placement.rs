//! Where a response's tensors live, and the seam between the engine and a
//! GPU data plane.
//!
//! The engine performs responses on host tensors through its backend's
//! host collectives. A response on device tensors (every rank's request
//! named a CUDA device) goes to the engine's [`DevicePlane`] instead —
//! NCCL's, with the `nccl` feature (see `crate::nccl`). This module needs
//! no CUDA: an engine without a plane fails device responses with an
//! error, and the placement is a pure function of the response.

use crate::engine::batches::Order;
use crate::engine::completion::{Completion, Part};
use crate::engine::submission::{Input, Inputs, Ready};
use kolo_protocol::{Device, Params, RequestKind, Response};
use kolo_timeline::Timeline;
use std::sync::Arc;

/// Where the tensors of one response live, across the ranks that sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Host memory on every rank (or no rank named a device: barrier, join).
    Host,
    /// A CUDA device on every rank.
    Device,
    /// Host memory on some ranks and a device on others. The coordinator's
    /// validation rejects this ([`kolo_protocol::ValidationError::DeviceMismatch`]),
    /// so a response never carries it; kept so the engine can refuse it
    /// rather than assume.
    Mixed,
}

/// The placement of tensors whose ranks named `devices`.
pub(crate) fn placement(devices: &[Device]) -> Placement {
    let gpus = devices.iter().filter(|d| !d.is_cpu()).count();
    match gpus {
        0 => Placement::Host,
        n if n == devices.len() => Placement::Device,
        _ => Placement::Mixed,
    }
}

/// True when `response` must be performed by a device plane.
pub(crate) fn on_device(response: &Response) -> bool {
    placement(&response.devices) != Placement::Host
}

/// Why a host engine refuses device tensors.
pub(crate) const NO_GPU_ENGINE: &str = "device tensors need a GPU engine (kolo::nccl::run or \
     Kolo::init_nccl_mpi); this engine only reduces host memory";

/// The message of a device response the engine cannot perform.
pub(crate) fn refusal(response: &Response, has_plane: bool) -> Option<String> {
    match placement(&response.devices) {
        Placement::Mixed => Some(format!(
            "host and device tensors in one operation (devices by rank: {})",
            response
                .devices
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ if !has_plane => Some(NO_GPU_ENGINE.into()),
        _ => None,
    }
}

/// One tensor as a device plane performs it: this rank's parameters and
/// input, and its handle's part, which the plane completes (from any
/// thread) once the device work is done.
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
pub(crate) struct DeviceEntry {
    pub params: Params,
    pub input: Input,
    pub part: Part,
    /// What orders the work after the submitter's, for a tensor lent by
    /// address (see [`Inputs::Device`]).
    pub ready: Option<Ready>,
}

/// A GPU data plane living on the engine's thread: performs the agreed
/// responses on device tensors, in order, and completes their entries
/// (when the device work is done, not when it is enqueued).
pub(crate) trait DevicePlane {
    /// The CUDA device the plane communicates on.
    fn ordinal(&self) -> usize;

    /// Performs one response of `kind` on device tensors: `slots` holds
    /// this rank's entry for each of the response's tensors (`None` where
    /// this rank joined or the entry already failed). Records the
    /// activities on `timeline` and ends every tensor's operation there.
    fn perform(
        &mut self,
        kind: RequestKind,
        response: &Response,
        slots: Vec<Option<DeviceEntry>>,
        timeline: &Timeline,
    );

    /// Allreduces every tensor of one whole submission of device tensors
    /// lent by address (`inputs`, see [`Inputs::Device`]) as one fused
    /// collective, in `order` (see [`crate::engine::batches::Whole`]),
    /// `response` being the first of its fused responses (dtype, op,
    /// scales); completes `completion`'s tensors once the device is done.
    /// Inputs of another type than the response's (a kolo bug) still
    /// take part, with the op's identity, and fail.
    fn allreduce_whole(
        &mut self,
        response: &Response,
        inputs: Inputs,
        order: &Order,
        completion: Arc<Completion>,
    );

    /// Frees the plane's device fusion buffers (in stream order, behind
    /// the work that may still use them); returns the bytes freed.
    fn release_buffers(&mut self) -> usize;
}

/// Where an engine keeps its GPU data plane, if it may have one. A host
/// engine's is [`NoPlane`], which leaves the engine `Send` (with a `Send`
/// backend), so that a caller's thread may run its cycles (see
/// `crate::engine::progress`); a GPU engine's plane stays on the engine's thread.
pub(crate) trait PlaneSlot {
    /// The plane, if there is one.
    fn plane(&mut self) -> Option<&mut dyn DevicePlane>;

    /// True when there is a plane.
    fn has_plane(&self) -> bool;

    /// The CUDA device of the plane, if there is one.
    fn ordinal(&self) -> Option<usize>;
}

impl PlaneSlot for Option<Box<dyn DevicePlane>> {
    fn plane(&mut self) -> Option<&mut dyn DevicePlane> {
        match self {
            Some(plane) => Some(plane.as_mut()),
            None => None,
        }
    }

    fn has_plane(&self) -> bool {
        self.is_some()
    }

    fn ordinal(&self) -> Option<usize> {
        self.as_ref().map(|plane| plane.ordinal())
    }
}

/// No device plane: a host-only engine.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NoPlane;

impl PlaneSlot for NoPlane {
    fn plane(&mut self) -> Option<&mut dyn DevicePlane> {
        None
    }

    fn has_plane(&self) -> bool {
        false
    }

    fn ordinal(&self) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn device() -> impl Strategy<Value = Device> {
        prop_oneof![Just(Device::Cpu), (0u32..8).prop_map(Device::Cuda)]
    }

    proptest! {
        #[test]
        fn placement_follows_the_devices(devices in proptest::collection::vec(device(), 0..9)) {
            let gpus = devices.iter().filter(|d| !d.is_cpu()).count();
            let expected = if gpus == 0 {
                Placement::Host
            } else if gpus == devices.len() {
                Placement::Device
            } else {
                Placement::Mixed
            };
            prop_assert_eq!(placement(&devices), expected);
        }

        #[test]
        fn only_plain_device_responses_reach_a_plane(devices in proptest::collection::vec(device(), 1..9)) {
            let mut response = kolo_protocol::Response::error("t", "");
            response.devices = devices.clone();
            let refused_with_plane = refusal(&response, true);
            match placement(&devices) {
                Placement::Host => prop_assert!(!on_device(&response)),
                Placement::Device => {
                    prop_assert!(on_device(&response));
                    prop_assert!(refused_with_plane.is_none());
                    prop_assert!(refusal(&response, false).is_some_and(|m| m.contains("GPU engine")));
                }
                Placement::Mixed => {
                    prop_assert!(on_device(&response));
                    prop_assert!(refused_with_plane.is_some_and(|m| m.contains("host and device")));
                }
            }
        }
    }

    #[test]
    fn different_gpus_on_different_ranks_are_one_device_placement() {
        assert_eq!(
            placement(&[Device::Cuda(0), Device::Cuda(1)]),
            Placement::Device
        );
        assert_eq!(placement(&[]), Placement::Host);
    }
}
