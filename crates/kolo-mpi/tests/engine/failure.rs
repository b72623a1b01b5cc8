//! A rank that fails mid-training must end the whole job, not leave its
//! peers waiting for its gradients forever.
//!
//! Every rank trains (async allreduces of four gradient tensors per step);
//! at step 5 rank 1 fails. With [`Fault::Panic`] the panic is caught and
//! the rank calls `Kolo::abort`, whose MPI hook prints a message naming
//! the rank and calls `MPI_Abort`: `mpirun` kills the others and exits
//! non-zero. With [`Fault::Exit`] the process just exits (no `MPI_Finalize`,
//! as a crash or an `exit` deep in user code would): `mpirun` notices and
//! ends the job.

use super::cases::panic_text;
use kolo::{Error, Kolo, ReduceOp};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;

/// How rank 1 fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Panic,
    Exit,
}

/// The step at which rank 1 fails.
const FAIL_AT: usize = 5;
/// Steps the others would run (they never get past `FAIL_AT`).
const STEPS: usize = 1000;

/// One rank's training with rank 1 failing; returns only if it did not
/// fail (the job is ended from outside).
pub fn train(kolo: &Kolo, fault: Fault) -> ExitCode {
    let rank = kolo.rank();
    match catch_unwind(AssertUnwindSafe(|| steps(kolo, fault))) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            kolo.abort(&format!("rank {rank} failed: {e}"));
            ExitCode::FAILURE
        }
        Err(panic) => {
            kolo.abort(&format!(
                "rank {rank} panicked: {}",
                panic_text(panic.as_ref())
            ));
            ExitCode::FAILURE
        }
    }
}

fn steps(kolo: &Kolo, fault: Fault) -> Result<(), Error> {
    let rank = kolo.rank();
    for step in 0..STEPS {
        if rank == 1 && step == FAIL_AT {
            match fault {
                Fault::Panic => panic!("injected failure at step {step}"),
                Fault::Exit => {
                    eprintln!("rank {rank}: exiting at step {step} without finalising MPI");
                    std::process::exit(3);
                }
            }
        }
        let mut grads: Vec<Vec<f32>> = (0..4).map(|t| vec![(rank + t) as f32; 256]).collect();
        let handles = grads
            .iter_mut()
            .enumerate()
            .map(|(t, g)| kolo.allreduce_async(&format!("grad/{t}"), g, ReduceOp::Average))
            .collect::<Result<Vec<_>, _>>()?;
        for handle in handles {
            handle.wait()?;
        }
    }
    Ok(())
}
