//! A case's buffers in the memory under test: host inputs uploaded with
//! `buffer_from`, results read back with `read_buffer` after
//! `synchronize` (a device backend may return before its work has run),
//! and what a case expects of the backend.

use crate::failure::{check, transport, Failure};
use kolo_transport::{Collectives, Element, Memory, TransportError};

/// A new buffer of `M` holding `data`.
pub(crate) fn upload<M: Memory, T: Element, C: Collectives<M>>(
    comm: &mut C,
    case: &str,
    rank: usize,
    data: &[T],
) -> Result<M::Owned<T>, Failure> {
    comm.buffer_from(data).map_err(transport(case, rank))
}

/// A new zeroed buffer of `len` elements of `M`.
pub(crate) fn zeroed<M: Memory, T: Element, C: Collectives<M>>(
    comm: &mut C,
    case: &str,
    rank: usize,
    len: usize,
) -> Result<M::Owned<T>, Failure> {
    comm.new_buffer(len).map_err(transport(case, rank))
}

/// The elements of `buf` once every operation called before has
/// completed.
pub(crate) fn download<M: Memory, T: Element, C: Collectives<M>>(
    comm: &mut C,
    case: &str,
    rank: usize,
    buf: &M::Owned<T>,
) -> Result<Vec<T>, Failure> {
    comm.synchronize().map_err(transport(case, rank))?;
    let want = M::owned_len(buf);
    let got = comm
        .read_buffer(M::view(buf))
        .map_err(transport(case, rank))?;
    if got.len() != want {
        return Err(check(
            case,
            rank,
            format!(
                "read_buffer returned {} elements of a buffer of {want}",
                got.len()
            ),
        ));
    }
    Ok(got)
}

/// What a case expects of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    /// A result, checked against the reference.
    Result,
    /// An [`TransportError::Unsupported`] error naming the dtype, before
    /// anything runs (see [`crate::SuiteOptions::unsupported_reductions`]).
    Unsupported,
}

impl Expect {
    /// [`Expect::Unsupported`] when `refused` holds.
    pub(crate) fn unsupported_if(refused: bool) -> Expect {
        if refused {
            Expect::Unsupported
        } else {
            Expect::Result
        }
    }
}

/// Checks that the backend refused a case on `T` as unsupported.
pub(crate) fn refused<T: Element>(
    case: &str,
    rank: usize,
    outcome: kolo_transport::Result<()>,
) -> Result<(), Failure> {
    let dtype = T::DTYPE.name();
    match outcome {
        Err(TransportError::Unsupported(message)) if message.contains(dtype) => Ok(()),
        Err(TransportError::Unsupported(message)) => Err(check(
            case,
            rank,
            format!("the Unsupported error does not name the dtype {dtype}: {message}"),
        )),
        Err(other) => Err(check(
            case,
            rank,
            format!("expected an Unsupported error for {dtype}, got: {other}"),
        )),
        Ok(()) => Err(check(
            case,
            rank,
            format!(
                "expected an Unsupported error for {dtype} (the options list it), got a result"
            ),
        )),
    }
}
