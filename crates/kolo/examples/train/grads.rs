//! How the train example's ranks average their gradients: on the host
//! (async allreduces in a scope) or, with the `nccl` feature, on the GPUs (`gpu.rs`).

use kolo::{Kolo, ReduceOp};

/// How a rank averages its gradients with the other ranks.
pub trait GradReducer {
    /// Replaces every gradient (named `grad/<names[i]>`) by its average
    /// over the ranks.
    fn average(
        &mut self,
        kolo: &Kolo,
        names: &[String],
        grads: &mut [Vec<f32>],
    ) -> Result<(), kolo::Error>;
}

/// Host gradients: one async allreduce per tensor in a scope, last layer
/// first (the order backprop produces them); the engine fuses them and
/// reduces them in place.
pub struct HostReducer;

impl GradReducer for HostReducer {
    fn average(
        &mut self,
        kolo: &Kolo,
        names: &[String],
        grads: &mut [Vec<f32>],
    ) -> Result<(), kolo::Error> {
        let names: Vec<String> = names.iter().map(|name| format!("grad/{name}")).collect();
        kolo.scope(|s| {
            let handles = names
                .iter()
                .zip(grads.iter_mut())
                .rev()
                .map(|(name, grad)| s.allreduce_async(name, grad, ReduceOp::Average))
                .collect::<Result<Vec<_>, _>>()?;
            handles.into_iter().try_for_each(|h| h.wait())
        })
    }
}
