//! The engine's hook for responses on device tensors: hands them to the
//! device plane, or fails them when the engine has none; and the choice
//! between the host and the device performer of a whole submission.

use super::{ParamsOf, Performer};
use crate::engine::batches::Whole;
use crate::engine::placement::{on_device, refusal, DeviceEntry, PlaneSlot};
use crate::engine::table::Entry;
use crate::error::Error;
use kolo_protocol::{DataType, Params, RequestKind, Response};
use kolo_transport::{with_element_type, Backend};

impl<B: Backend, D: PlaneSlot> Performer<B, D> {
    /// True when this engine can perform `head`'s fused allreduce over a
    /// whole submission: host tensors, or device tensors with a device
    /// plane.
    pub(crate) fn whole_served(&self, head: &Response) -> bool {
        !on_device(head) || refusal(head, self.device.has_plane()).is_none()
    }

    /// Performs the fused allreduce of the claimed submission `whole`
    /// (`head` the first of its responses): on the host straight over its
    /// lent memory, or on the device plane over its lent addresses, which
    /// completes it once the device is done.
    pub(crate) fn perform_whole(&mut self, head: &Response, whole: Whole) {
        self.shared.stats.lock().whole_operations += 1;
        if !on_device(head) {
            with_element_type!(head.dtype, T => self.allreduce_whole::<T>(head, whole));
            return;
        }
        let order = whole.order().clone();
        let Some((completion, inputs)) = self.batches.detach_whole(whole) else {
            return;
        };
        match self.device.plane() {
            Some(plane) => plane.allreduce_whole(head, inputs, &order, completion),
            // `whole_served` checked the plane first.
            None => completion.fail_open(|tensor| Error::Collective {
                tensor: tensor.to_owned(),
                message: crate::engine::placement::NO_GPU_ENGINE.into(),
            }),
        }
    }

    /// Performs a response whose tensors live on a device: hands them to
    /// the device plane, which completes them once the device is done.
    pub(crate) fn perform_device(
        &mut self,
        kind: RequestKind,
        response: &Response,
        slots: Vec<Option<Entry>>,
        params: ParamsOf<'_>,
    ) {
        match (
            refusal(response, self.device.has_plane()),
            self.device.has_plane(),
        ) {
            (None, true) => {
                let entries: Vec<Option<DeviceEntry>> = slots
                    .into_iter()
                    .map(|slot| {
                        let entry = slot?;
                        let params = params
                            .of(&entry)
                            .cloned()
                            .unwrap_or_else(|| Params::new(RequestKind::Barrier, DataType::U8, []));
                        let ready = self.batches.device_ready(entry.part);
                        let part = self.batches.detach(entry.part)?;
                        Some(DeviceEntry {
                            params,
                            input: entry.input,
                            part,
                            ready,
                        })
                    })
                    .collect();
                if let Some(plane) = self.device.plane() {
                    plane.perform(kind, response, entries, &self.timeline);
                }
            }
            (message, _) => {
                let message = message.unwrap_or_default();
                for (name, slot) in response.tensor_names.iter().zip(slots) {
                    let error = Error::Collective {
                        tensor: name.clone(),
                        message: message.clone(),
                    };
                    self.finish(name, slot, Err(error), response.dtype, &[]);
                }
            }
        }
    }
}
