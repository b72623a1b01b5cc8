//! Allreduce (contiguous and over segments) and reduce-scatter.

use super::check_counts;
use crate::failure::{agree, transport, Failure};
use crate::reference::Reduction;
use crate::values::{inputs, salt_of, Values};
use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Controller, Element, Scale};

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
    let (rank, n) = (comm.rank(), comm.size());
    let case = format!(
        "allreduce dtype={} count={count} op={} prescale={} postscale={} size={n}",
        T::DTYPE,
        op.name(),
        scale.prescale,
        scale.postscale
    );
    let reduction = reduction(&case, n, op, scale);
    let mut buf = inputs::<T>(count, reduction.values, reduction.salt, rank, 0);
    comm.allreduce(&mut buf, op, scale)
        .map_err(transport(&case, rank))?;
    let local = reduction.check(&case, rank, 0, &buf, 0);
    agree(comm, &case, local)
}

/// `allreduce_segments` over segments of `lens` elements of `T` (the same
/// on every rank; zero segments and empty ones allowed) with `op` and
/// `scale`. Rank r's inputs are those an allreduce of the concatenation
/// would get, cut into the segments; every rank checks every segment
/// against the reduction of the concatenation, reporting indices into it.
pub fn check_allreduce_segments<T: Element, C: Collectives + Controller>(
    comm: &mut C,
    lens: &[usize],
    op: ReduceOp,
    scale: Scale,
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
        segments.push(inputs::<T>(
            len,
            reduction.values,
            reduction.salt,
            rank,
            start as u64,
        ));
        start += len;
    }
    let mut views: Vec<&mut [T]> = segments.iter_mut().map(Vec::as_mut_slice).collect();
    comm.allreduce_segments(&mut views, op, scale)
        .map_err(transport(&case, rank))?;
    let mut local = Ok(());
    let mut start = 0;
    for segment in &segments {
        local = local.and_then(|()| reduction.check(&case, rank, start, segment, start));
        start += segment.len();
    }
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
    let send = inputs::<T>(total, reduction.values, reduction.salt, rank, 0);
    let mut recv = vec![T::default(); counts[rank]];
    comm.reduce_scatter(&send, &mut recv, counts, op, scale)
        .map_err(transport(&case, rank))?;
    let local = reduction.check(&case, rank, offset, &recv, 0);
    agree(comm, &case, local)
}
