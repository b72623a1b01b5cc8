//! A rank that fails mid-training must not leave its peers waiting for
//! its gradients forever. The training loop is the suite's; how the rank
//! fails and what its peers must see is the backend's (a threads rank
//! panics and its peers' handles fail naming it; an MPI rank panics or
//! exits and `mpirun` ends the job naming it).

use kolo::{Error, Kolo, ReduceOp};

/// The step at which [`train`] calls the failure.
pub const FAIL_AT: usize = 5;
/// Steps the others would run (they never get past [`FAIL_AT`]).
pub const STEPS: usize = 1000;

/// Trains (async allreduces of four gradient tensors per step); rank 1
/// calls `fail` at step [`FAIL_AT`] (a panic, an exit, ...). Returns the
/// first error the peers see: the engine's report of rank 1's failure.
pub fn train(kolo: &Kolo, fail: impl Fn(usize)) -> Result<(), Error> {
    let rank = kolo.rank();
    for step in 0..STEPS {
        if rank == 1 && step == FAIL_AT {
            fail(step);
        }
        let mut grads: Vec<Vec<f32>> = (0..4).map(|t| vec![(rank + t) as f32; 256]).collect();
        let names: Vec<String> = (0..4).map(|t| format!("grad/{t}")).collect();
        crate::allreduce_each(kolo, &names, grads.iter_mut(), ReduceOp::Average)?;
    }
    Ok(())
}
