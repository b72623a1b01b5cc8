//! Without CUDA (CI), creating communicators fails cleanly on every rank:
//! an error naming the cause and the rank, no panic, no hang. With CUDA
//! these checks have nothing to say (the GPU binaries cover that case).

use kolo_nccl::{NcclComm, NcclError, NcclOptions};

fn cuda_missing() -> bool {
    kolo_nccl::probe::platform().is_err()
}

#[test]
fn every_rank_reports_the_missing_library() {
    if !cuda_missing() {
        return;
    }
    let errors = kolo_threads::run(3, |ctrl| {
        match NcclComm::init(ctrl, NcclOptions::default()) {
            Ok(_) => Err("a communicator without CUDA".to_string()),
            Err(e) => Ok(e),
        }
    })
    .expect("every rank returns its error");
    assert_eq!(errors.len(), 3);
    for e in errors {
        match e {
            NcclError::Bootstrap { rank: 0, message } => {
                assert!(message.starts_with("opening the device:"), "{message}");
                assert!(
                    message.contains("libcuda") || message.contains("device"),
                    "{message}"
                );
            }
            other => panic!("unexpected error {other}"),
        }
    }
}

#[test]
fn thread_mode_run_fails_on_every_rank() {
    if !cuda_missing() {
        return;
    }
    let ctrls = kolo_threads::communicators(2).expect("two ranks");
    let err = kolo_nccl::threads::run(ctrls, NcclOptions::default(), |_, _| Ok(())).unwrap_err();
    assert_eq!(err.failures.len(), 2);
    assert!(
        err.to_string().contains("bootstrap failed on rank 0"),
        "{err}"
    );
}
