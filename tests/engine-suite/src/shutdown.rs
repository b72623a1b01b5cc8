//! Shutdown with operations pending: their handles fail naming the rank
//! that asked, never hang.

use crate::{expect_err, Digest};
use kolo::{Error, Kolo, ReduceOp};

/// Rank 0 shuts down while the others have an operation pending (that
/// rank 0 never submits): their handles fail with a shutdown naming rank
/// 0, later calls fail the same way, and every rank then ends normally.
pub fn shutdown_fails_pending_handles(kolo: &Kolo) -> Result<Digest, Error> {
    let expected = Error::ShutDown { by_ranks: vec![0] };
    let mut x = [1i32; 4];
    if kolo.rank() == 0 {
        kolo.barrier()?;
        kolo.shutdown()?;
        kolo.shutdown()?; // idempotent
    } else {
        // The scope ends once the shutdown failed its pending tensor.
        kolo.scope(|s| {
            let pending = s.allreduce_async("pending", &mut x, ReduceOp::Sum)?;
            kolo.barrier()?;
            let err = expect_err(pending.wait(), "rank 0 never submits 'pending'");
            assert_eq!(err, expected);
            assert_eq!(
                err.to_string(),
                "kolo was shut down at the request of rank 0"
            );
            Ok::<(), Error>(())
        })?;
        assert_eq!(x, [1; 4], "a failed tensor is untouched");
    }
    assert!(kolo.is_shut_down());
    let later = kolo.allreduce("after", &mut x, ReduceOp::Sum);
    assert_eq!(later, Err(expected));
    Ok(None)
}
