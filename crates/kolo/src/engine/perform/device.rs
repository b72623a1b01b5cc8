//! The engine's hook for responses on device tensors: hands them to the
//! device plane, or fails them when the engine has none.

use super::{ParamsOf, Performer};
use crate::engine::placement::{refusal, DeviceEntry, PlaneSlot};
use crate::engine::table::Entry;
use crate::error::Error;
use kolo_protocol::{DataType, Params, RequestKind, Response};
use kolo_transport::Backend;

impl<B: Backend, D: PlaneSlot> Performer<B, D> {
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
                        let part = self.batches.detach(entry.part)?;
                        Some(DeviceEntry {
                            params,
                            input: entry.input,
                            part,
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
