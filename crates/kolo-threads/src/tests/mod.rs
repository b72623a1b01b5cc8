//! Tests of whole communicators: collectives against references, failure
//! propagation, departure, and mismatches between ranks.

mod bomb;
mod collectives;
mod control;
mod failures;
mod segments;

use crate::{run, ThreadComm};
use kolo_transport::TransportError;

/// Runs `f` on `n` ranks and returns the results, failing the test with the
/// run's error.
fn on_ranks<R: Send>(
    n: usize,
    f: impl Fn(&mut ThreadComm) -> Result<R, TransportError> + Sync,
) -> Vec<R> {
    match run(n, f) {
        Ok(values) => values,
        Err(err) => panic!("run failed: {err}"),
    }
}

/// A deterministic test value for element `i` of rank `rank`.
fn value(rank: usize, i: usize) -> i32 {
    ((rank * 7 + i * 13) % 101) as i32 - 50
}
