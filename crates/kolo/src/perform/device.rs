//! The engine's hook for responses on device tensors: hands them to the
//! device plane, or fails them when the engine has none.

use crate::background::{Engine, ParamsOf};
use crate::device::{refusal, DeviceEntry, PlaneSlot};
use crate::error::Error;
use crate::table::Entry;
use kolo_protocol::{DataType, Params, RequestKind, Response};
use kolo_transport::Backend;

impl<B: Backend, D: PlaneSlot> Engine<B, D> {
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

#[cfg(test)]
mod tests {
    use crate::{threads, Config, Error, Kolo};
    use kolo_protocol::{DataType, Device, RequestKind};

    /// Submits an allreduce request on `device` with no data (the engine
    /// refuses device responses before looking at it).
    fn submit_on(kolo: &Kolo, name: &str, device: Device) -> Result<(), Error> {
        let params = kolo_protocol::Params {
            device,
            ..kolo.params(RequestKind::Allreduce, DataType::F32, &[4])
        };
        let completion = kolo.submit_one(name, params, crate::table::Input::None)?;
        crate::handle::Handle::new(completion, |_| Ok(())).wait()
    }

    #[test]
    fn a_cpu_gpu_mix_fails_on_every_rank_naming_tensor_and_ranks() {
        let errors = threads::run(2, Config::default(), |kolo| {
            let device = if kolo.rank() == 0 {
                Device::Cpu
            } else {
                Device::Cuda(1)
            };
            Ok(submit_on(kolo, "grad/mixed", device).err())
        })
        .unwrap();
        for error in errors {
            let Some(Error::Mismatch { tensor, message }) = error else {
                panic!("expected a mismatch, got {error:?}");
            };
            assert_eq!(tensor, "grad/mixed");
            assert!(message.contains("CPU/GPU"), "{message}");
            assert!(message.contains("rank 0 sent cpu"), "{message}");
            assert!(message.contains("rank 1 sent cuda:1"), "{message}");
        }
    }

    #[test]
    fn device_tensors_on_a_host_engine_fail_clearly() {
        let errors = threads::run(2, Config::default(), |kolo| {
            assert_eq!(kolo.gpu(), None);
            let device = Device::Cuda(kolo.rank() as u32);
            let first = submit_on(kolo, "grad/gpu", device).err();
            // The engine is still usable afterwards.
            let mut host = [1.0f32; 2];
            kolo.allreduce("grad/host", &mut host, kolo_protocol::ReduceOp::Sum)?;
            assert_eq!(host, [2.0; 2]);
            Ok(first)
        })
        .unwrap();
        for error in errors {
            let Some(Error::Collective { tensor, message }) = error else {
                panic!("expected a collective error, got {error:?}");
            };
            assert_eq!(tensor, "grad/gpu");
            assert!(message.contains("GPU engine"), "{message}");
        }
    }
}
