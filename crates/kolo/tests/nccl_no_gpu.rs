//! The GPU engine on a machine without a usable GPU (CI): starting it is a
//! clear error on every rank, never a panic or a hang.

use kolo::{Config, Error};

/// Whether this machine can run NCCL at all (then there is nothing to test
/// here: the GPU test binary covers it).
fn gpu_present() -> bool {
    kolo_nccl::probe::platform().is_ok_and(|p| p.devices > 0)
}

#[test]
fn starting_without_a_gpu_is_a_start_error() {
    if gpu_present() {
        return;
    }
    let outcome = kolo::nccl::run(2, Config::default(), |kolo| Ok(kolo.rank()));
    match outcome {
        Err(Error::Start { message }) => {
            assert!(message.contains("cannot start NCCL on rank"), "{message}");
        }
        other => panic!("expected a start error, got {other:?}"),
    }
}

#[test]
fn one_rank_without_a_gpu_fails_the_same_way() {
    if gpu_present() {
        return;
    }
    let outcome = kolo::nccl::run(1, Config::default(), |_| Ok(()));
    assert!(matches!(outcome, Err(Error::Start { .. })), "{outcome:?}");
}
