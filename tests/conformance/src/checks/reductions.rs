//! Allreduce (contiguous and over segments) and reduce-scatter.

use super::check_counts;
use crate::buffers::{download, refused, upload, zeroed, Expect};
use crate::failure::{agree, transport, Failure};
use crate::reference::Reduction;
use crate::values::{inputs, salt_of, Values};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Controller, Element, Host, Memory, Scale};

fn reduction(case: &str, ranks: usize, op: ReduceOp, scale: Scale) -> Reduction {
    Reduction {
        values: Values::for_op(op),
        salt: salt_of(case),
        ranks,
        op,
        scale,
    }
}

/// Allreduce of `count` elements of `T` with `op` and `scale`; every rank
/// checks the whole result.
pub fn check_allreduce<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    count: usize,
    op: ReduceOp,
    scale: Scale,
) -> Result<(), Failure> {
    check_allreduce_on::<Host, T, C>(comm, count, op, scale)
}

/// [`check_allreduce`] on memory `M`.
pub fn check_allreduce_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    count: usize,
    op: ReduceOp,
    scale: Scale,
) -> Result<(), Failure> {
    allreduce_case::<M, T, C>(comm, count, op, scale, Expect::Result)
}

pub(crate) fn allreduce_case<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    count: usize,
    op: ReduceOp,
    scale: Scale,
    expect: Expect,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!(
        "allreduce dtype={} count={count} op={} prescale={} postscale={} size={n}",
        T::DTYPE,
        op.name(),
        scale.prescale,
        scale.postscale
    );
    let reduction = reduction(&case, n, op, scale);
    let host = inputs::<T>(count, reduction.values, reduction.salt, rank, 0);
    let mut buf = upload::<M, T, C>(comm, &case, rank, &host)?;
    let outcome = comm.allreduce(M::view_mut(&mut buf), op, scale);
    let local = match expect {
        Expect::Unsupported => refused::<T>(&case, rank, outcome),
        Expect::Result => {
            outcome.map_err(transport(&case, rank))?;
            let got = download::<M, T, C>(comm, &case, rank, &buf)?;
            reduction.check(&case, rank, 0, &got, 0)
        }
    };
    agree(comm, &case, local)
}

/// `allreduce_segments` over segments of `lens` elements of `T` (the same
/// on every rank; zero segments and empty ones allowed) with `op` and
/// `scale`. Rank r's inputs are those an allreduce of the concatenation
/// would get, cut into the segments (one buffer each); every rank checks
/// every segment against the reduction of the concatenation, reporting
/// indices into it.
pub fn check_allreduce_segments<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    lens: &[usize],
    op: ReduceOp,
    scale: Scale,
) -> Result<(), Failure> {
    check_allreduce_segments_on::<Host, T, C>(comm, lens, op, scale)
}

/// [`check_allreduce_segments`] on memory `M`.
pub fn check_allreduce_segments_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    lens: &[usize],
    op: ReduceOp,
    scale: Scale,
) -> Result<(), Failure> {
    allreduce_segments_case::<M, T, C>(comm, lens, op, scale, Expect::Result)
}

pub(crate) fn allreduce_segments_case<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    lens: &[usize],
    op: ReduceOp,
    scale: Scale,
    expect: Expect,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let total: usize = lens.iter().sum();
    let layout = if lens.len() <= 8 {
        format!("{lens:?}")
    } else {
        format!("{} segments", lens.len())
    };
    let case = format!(
        "allreduce_segments dtype={} lens={layout} total={total} op={} prescale={} postscale={} size={n}",
        T::DTYPE,
        op.name(),
        scale.prescale,
        scale.postscale
    );
    let reduction = reduction(&case, n, op, scale);
    let mut segments = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in lens {
        let host = inputs::<T>(len, reduction.values, reduction.salt, rank, start as u64);
        segments.push(upload::<M, T, C>(comm, &case, rank, &host)?);
        start += len;
    }
    let outcome = {
        let mut views: Vec<M::Mut<'_, T>> = segments.iter_mut().map(M::view_mut).collect();
        comm.allreduce_segments(&mut views, op, scale)
    };
    let local = match expect {
        Expect::Unsupported => refused::<T>(&case, rank, outcome),
        Expect::Result => {
            outcome.map_err(transport(&case, rank))?;
            let mut local = Ok(());
            let mut start = 0;
            for (segment, &len) in segments.iter().zip(lens) {
                let got = download::<M, T, C>(comm, &case, rank, segment)?;
                local = local.and_then(|()| reduction.check(&case, rank, start, &got, start));
                start += len;
            }
            local
        }
    };
    agree(comm, &case, local)
}

/// Reduce-scatter with `counts[r]` elements for rank r (`counts` has one
/// entry per rank, the same on every rank; zeros allowed); every rank checks
/// its block.
pub fn check_reduce_scatter<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    counts: &[usize],
    op: ReduceOp,
    scale: Scale,
) -> Result<(), Failure> {
    check_reduce_scatter_on::<Host, T, C>(comm, counts, op, scale)
}

/// [`check_reduce_scatter`] on memory `M`.
pub fn check_reduce_scatter_on<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    counts: &[usize],
    op: ReduceOp,
    scale: Scale,
) -> Result<(), Failure> {
    reduce_scatter_case::<M, T, C>(comm, counts, op, scale, Expect::Result)
}

pub(crate) fn reduce_scatter_case<M: Memory, T: Element, C: Collectives<M> + Controller>(
    comm: &mut C,
    counts: &[usize],
    op: ReduceOp,
    scale: Scale,
    expect: Expect,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!(
        "reduce_scatter dtype={} counts={counts:?} op={} prescale={} postscale={} size={n}",
        T::DTYPE,
        op.name(),
        scale.prescale,
        scale.postscale
    );
    check_counts(&case, rank, counts, n)?;
    let reduction = reduction(&case, n, op, scale);
    let total = counts.iter().sum();
    let offset: usize = counts[..rank].iter().sum();
    let host = inputs::<T>(total, reduction.values, reduction.salt, rank, 0);
    let send = upload::<M, T, C>(comm, &case, rank, &host)?;
    let mut recv = zeroed::<M, T, C>(comm, &case, rank, counts[rank])?;
    let outcome = comm.reduce_scatter(M::view(&send), M::view_mut(&mut recv), counts, op, scale);
    let local = match expect {
        Expect::Unsupported => refused::<T>(&case, rank, outcome),
        Expect::Result => {
            outcome.map_err(transport(&case, rank))?;
            let got = download::<M, T, C>(comm, &case, rank, &recv)?;
            reduction.check(&case, rank, offset, &got, 0)
        }
    };
    agree(comm, &case, local)
}
