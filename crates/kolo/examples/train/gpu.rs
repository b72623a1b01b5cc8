//! The GPU half of the train example: gradients averaged on the devices.

use super::grads::GradReducer;
use kolo::nccl::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use kolo::{Kolo, ReduceOp, TensorGroup};
use std::sync::Arc;

/// Gradients uploaded into persistent device buffers, averaged by one
/// device allreduce of their [`TensorGroup`] (one fused NCCL allreduce
/// once the step repeats), downloaded.
pub struct DeviceReducer {
    stream: Arc<CudaStream>,
    buffers: Vec<CudaSlice<f32>>,
    group: Option<TensorGroup>,
}

/// A CUDA failure as a kolo error about `what`.
fn cuda(what: &str) -> impl Fn(kolo::nccl::cudarc::driver::DriverError) -> kolo::Error + '_ {
    move |e| kolo::Error::Collective {
        tensor: "grad".into(),
        message: format!("{what}: {e:?}"),
    }
}

impl DeviceReducer {
    /// A stream of this rank on the engine's GPU.
    pub fn new(kolo: &Kolo) -> Result<Self, kolo::Error> {
        let gpu = kolo.gpu().ok_or_else(|| kolo::Error::Start {
            message: "the engine has no GPU".into(),
        })?;
        let stream = CudaContext::new(gpu)
            .and_then(|ctx| ctx.new_stream())
            .map_err(cuda("creating a stream"))?;
        Ok(DeviceReducer {
            stream,
            buffers: Vec::new(),
            group: None,
        })
    }
}

impl GradReducer for DeviceReducer {
    fn average(
        &mut self,
        kolo: &Kolo,
        names: &[String],
        grads: &mut [Vec<f32>],
    ) -> Result<(), kolo::Error> {
        if self.buffers.len() != grads.len() {
            self.buffers = grads
                .iter()
                .map(|g| self.stream.alloc_zeros::<f32>(g.len()))
                .collect::<Result<_, _>>()
                .map_err(cuda("allocating gradient buffers"))?;
        }
        for (grad, buffer) in grads.iter().zip(&mut self.buffers) {
            self.stream
                .memcpy_htod(grad, buffer)
                .map_err(cuda("uploading a gradient"))?;
        }
        let group = match &self.group {
            Some(group) if group.len() == names.len() => group,
            _ => self
                .group
                .insert(TensorGroup::new(names.iter().map(|n| format!("grad/{n}")))?),
        };
        kolo.allreduce_group(group, self.buffers.iter_mut(), ReduceOp::Average)?;
        for (grad, buffer) in grads.iter_mut().zip(&self.buffers) {
            self.stream
                .memcpy_dtoh(buffer, grad)
                .map_err(cuda("downloading a gradient"))?;
        }
        Ok(())
    }
}
