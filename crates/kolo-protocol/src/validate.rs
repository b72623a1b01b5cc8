//! Validation: the requests every rank sent for one tensor name become the
//! one [`Response`] all ranks perform, or an error response that names the
//! tensor, the conflicting values and the ranks that sent them.
//!
//! The result never depends on the order in which requests arrived: they
//! are sorted by rank first, checks run in a fixed order, and a conflict is
//! always reported between the lowest-ranked request and the first higher
//! rank that differs from it.

mod error;

pub use error::ValidationError;

use crate::message::{Request, Response, ResponseKind};
use crate::types::{Compression, ReduceOp, RequestKind};

/// Validates the requests that the ranks sent for one tensor name (at most
/// one per rank, in any order) into the response every rank performs: an
/// op response, or an error response (`kind == ResponseKind::Error`,
/// `tensor_names == [name]`) whose `error_message` names the tensor, both
/// conflicting values and the ranks that sent them.
///
/// Fewer than `world_size` requests are allowed: the coordinator validates
/// once the ranks that must contribute have done so, and ranks that joined
/// send nothing. `devices` then lists only the ranks present (in rank
/// order), while an allgather's `first_dims` always has `world_size`
/// entries, 0 for an absent rank (it contributes no rows), and an
/// alltoall's `splits` is always `world_size x world_size`, zeros for an
/// absent rank.
///
/// See [`try_validate`] for the typed error and the checks made.
pub fn validate(requests: &[Request], world_size: u32) -> Response {
    match try_validate(requests, world_size) {
        Ok(response) => response,
        Err(error) => {
            let name = sorted_by_rank(requests)
                .first()
                .map(|r| r.tensor_name.clone())
                .unwrap_or_default();
            Response::error(name, error.to_string())
        }
    }
}

/// [`validate`] with a typed error.
///
/// Checks, in this order: every rank `< world_size`; at most one request per
/// rank; one tensor name; one collective. Barrier and join stop here. Then
/// one dtype; CPU and GPU not mixed (different GPU ordinals are fine); and
/// per collective:
/// - allreduce, reduce-scatter: one reduce op, prescale and postscale
///   (bitwise), one shape; reduce-scatter needs at least one dimension;
/// - broadcast: one root rank, `< world_size`; one shape;
/// - allgather, alltoall: no scalar, one number of dimensions, the same
///   dimensions after the first; alltoall splits have `world_size` entries
///   summing to the first dimension, or are empty (an even split, which
///   needs a first dimension divisible by `world_size`).
///
/// On success the response carries `kind = Op(kind)`, `tensor_names =
/// [name]`, the dtype, `devices` in rank order, the reduce op and scales
/// (allreduce, reduce-scatter; `Sum`, 1.0 and 1.0 otherwise), the root rank
/// (broadcast; 0 otherwise), `tensor_sizes = [num_elements]` (allreduce,
/// broadcast, reduce-scatter — whose `first_dims` is `[rows]`; for
/// allgather the gathered tensor's count,
/// `sum(first_dims) * row elements`), `first_dims` (allgather) and `splits`
/// (alltoall) as described at [`validate`].
pub fn try_validate(requests: &[Request], world_size: u32) -> Result<Response, ValidationError> {
    let sorted = sorted_by_rank(requests);
    let Some(&first) = sorted.first() else {
        return Err(ValidationError::NoRequests);
    };
    let tensor = || first.tensor_name.clone();

    if let Some(r) = sorted.iter().find(|r| r.rank >= world_size) {
        return Err(ValidationError::RankOutOfRange {
            tensor: tensor(),
            rank: r.rank,
            world_size,
        });
    }
    if let Some(pair) = sorted.windows(2).find(|pair| pair[0].rank == pair[1].rank) {
        return Err(ValidationError::DuplicateRank {
            tensor: tensor(),
            rank: pair[0].rank,
        });
    }
    if let Some(other) = first_differing(&sorted, |r| &r.tensor_name) {
        return Err(ValidationError::NameMismatch {
            rank_a: first.rank,
            a: tensor(),
            rank_b: other.rank,
            b: other.tensor_name.clone(),
        });
    }
    let kind = first.kind;
    if let Some(other) = first_differing(&sorted, |r| r.kind) {
        return Err(ValidationError::KindMismatch {
            tensor: tensor(),
            rank_a: first.rank,
            a: kind,
            rank_b: other.rank,
            b: other.kind,
        });
    }
    let mut response = op_response(kind, &sorted);
    if matches!(kind, RequestKind::Barrier | RequestKind::Join) {
        return Ok(response);
    }

    if let Some(other) = first_differing(&sorted, |r| r.dtype) {
        return Err(ValidationError::DtypeMismatch {
            kind,
            tensor: tensor(),
            rank_a: first.rank,
            a: first.dtype,
            rank_b: other.rank,
            b: other.dtype,
        });
    }
    if let Some(other) = first_differing(&sorted, |r| r.device.is_cpu()) {
        return Err(ValidationError::DeviceMismatch {
            kind,
            tensor: tensor(),
            rank_a: first.rank,
            a: first.device,
            rank_b: other.rank,
            b: other.device,
        });
    }

    match kind {
        RequestKind::Allreduce | RequestKind::ReduceScatter => {
            check_reduction(&sorted)?;
            check_same_shape(&sorted)?;
            if kind == RequestKind::ReduceScatter && first.shape.is_empty() {
                return Err(ValidationError::ScalarTensor {
                    kind,
                    tensor: tensor(),
                    rank: first.rank,
                });
            }
            response.reduce_op = first.reduce_op;
            response.prescale = first.prescale;
            response.postscale = first.postscale;
            response.compression = first.compression;
            response.tensor_sizes = vec![element_count(first)?];
            if kind == RequestKind::ReduceScatter {
                // The rows split across ranks; a joined rank, which has no
                // tensor, needs it to take part.
                response.first_dims = vec![first.shape[0]];
            }
        }
        RequestKind::Broadcast => {
            if let Some(other) = first_differing(&sorted, |r| r.root_rank) {
                return Err(ValidationError::RootRankMismatch {
                    tensor: tensor(),
                    rank_a: first.rank,
                    a: first.root_rank,
                    rank_b: other.rank,
                    b: other.root_rank,
                });
            }
            if first.root_rank >= world_size {
                return Err(ValidationError::RootRankOutOfRange {
                    tensor: tensor(),
                    rank: first.rank,
                    root: first.root_rank,
                    world_size,
                });
            }
            check_same_shape(&sorted)?;
            response.root_rank = first.root_rank;
            response.tensor_sizes = vec![element_count(first)?];
        }
        RequestKind::Allgather => {
            check_gather_shapes(&sorted)?;
            let mut first_dims = vec![0; world_size as usize];
            for r in &sorted {
                // Ranks are < world_size and shapes non-empty: checked above.
                first_dims[r.rank as usize] = r.shape[0];
            }
            // The gathered tensor's element count: every rank's rows times
            // the elements of one row (used to size fused allgathers).
            let row_elems: u64 = first.shape[1..].iter().product();
            let rows = first_dims
                .iter()
                .try_fold(0u64, |acc, &d| acc.checked_add(d));
            let gathered = rows.and_then(|rows| rows.checked_mul(row_elems));
            response.tensor_sizes =
                vec![
                    gathered.ok_or_else(|| ValidationError::ElementCountOverflow {
                        kind: first.kind,
                        tensor: tensor(),
                        rank: first.rank,
                        shape: first.shape.clone(),
                    })?,
                ];
            response.first_dims = first_dims;
        }
        RequestKind::Alltoall => {
            check_gather_shapes(&sorted)?;
            response.splits = alltoall_splits(&sorted, world_size)?;
        }
        RequestKind::Barrier | RequestKind::Join => {}
    }
    Ok(response)
}

// The helpers below take the rank-sorted requests, which `try_validate`
// has checked to be non-empty, so `sorted[0]` is the lowest-ranked request.

/// The requests sorted by rank (then name, so that even duplicates sort the
/// same whatever their arrival order).
fn sorted_by_rank(requests: &[Request]) -> Vec<&Request> {
    let mut sorted: Vec<&Request> = requests.iter().collect();
    sorted.sort_by(|a, b| (a.rank, &a.tensor_name).cmp(&(b.rank, &b.tensor_name)));
    sorted
}

/// The first request whose `key` differs from the lowest-ranked one's.
fn first_differing<'a, K: PartialEq>(
    sorted: &[&'a Request],
    key: impl Fn(&'a Request) -> K,
) -> Option<&'a Request> {
    let (&first, rest) = sorted.split_first()?;
    let expected = key(first);
    rest.iter().copied().find(|&r| key(r) != expected)
}

/// A successful response with the fields every collective shares; the
/// per-collective fields are neutral until filled in.
fn op_response(kind: RequestKind, sorted: &[&Request]) -> Response {
    let first = sorted[0];
    Response {
        kind: ResponseKind::Op(kind),
        tensor_names: vec![first.tensor_name.clone()],
        error_message: String::new(),
        dtype: first.dtype,
        devices: sorted.iter().map(|r| r.device).collect(),
        reduce_op: ReduceOp::Sum,
        root_rank: 0,
        prescale: 1.0,
        postscale: 1.0,
        first_dims: Vec::new(),
        splits: Vec::new(),
        tensor_sizes: Vec::new(),
        compression: Compression::None,
    }
}

fn check_reduction(sorted: &[&Request]) -> Result<(), ValidationError> {
    let first = sorted[0];
    if let Some(other) = first_differing(sorted, |r| r.reduce_op) {
        return Err(ValidationError::ReduceOpMismatch {
            kind: first.kind,
            tensor: first.tensor_name.clone(),
            rank_a: first.rank,
            a: first.reduce_op,
            rank_b: other.rank,
            b: other.reduce_op,
        });
    }
    if let Some(other) = first_differing(sorted, |r| r.compression) {
        return Err(ValidationError::CompressionMismatch {
            kind: first.kind,
            tensor: first.tensor_name.clone(),
            rank_a: first.rank,
            a: first.compression,
            rank_b: other.rank,
            b: other.compression,
        });
    }
    check_scale(sorted, "prescale", |r| r.prescale)?;
    check_scale(sorted, "postscale", |r| r.postscale)
}

/// Scale factors compare bitwise: NaN matches NaN (so the check cannot
/// depend on arrival order), and 0.0 differs from -0.0.
fn check_scale(
    sorted: &[&Request],
    which: &'static str,
    scale: fn(&Request) -> f64,
) -> Result<(), ValidationError> {
    let first = sorted[0];
    match first_differing(sorted, |r| scale(r).to_bits()) {
        None => Ok(()),
        Some(other) => Err(ValidationError::ScaleMismatch {
            kind: first.kind,
            which,
            tensor: first.tensor_name.clone(),
            rank_a: first.rank,
            a: scale(first),
            rank_b: other.rank,
            b: scale(other),
        }),
    }
}

fn check_same_shape(sorted: &[&Request]) -> Result<(), ValidationError> {
    let first = sorted[0];
    match first_differing(sorted, |r| r.shape.as_slice()) {
        None => Ok(()),
        Some(other) => Err(ValidationError::ShapeMismatch {
            kind: first.kind,
            tensor: first.tensor_name.clone(),
            rank_a: first.rank,
            a: first.shape.clone(),
            rank_b: other.rank,
            b: other.shape.clone(),
        }),
    }
}

/// Allgather and alltoall: the first dimension may differ per rank, the
/// rest must agree, and there must be a first dimension.
fn check_gather_shapes(sorted: &[&Request]) -> Result<(), ValidationError> {
    let first = sorted[0];
    if let Some(scalar) = sorted.iter().find(|r| r.shape.is_empty()) {
        return Err(ValidationError::ScalarTensor {
            kind: first.kind,
            tensor: first.tensor_name.clone(),
            rank: scalar.rank,
        });
    }
    if let Some(other) = first_differing(sorted, |r| r.shape.len()) {
        return Err(ValidationError::DimensionCountMismatch {
            kind: first.kind,
            tensor: first.tensor_name.clone(),
            rank_a: first.rank,
            a: first.shape.clone(),
            rank_b: other.rank,
            b: other.shape.clone(),
        });
    }
    if let Some(other) = first_differing(sorted, |r| &r.shape[1..]) {
        let dim = (1..first.shape.len())
            .find(|&d| first.shape[d] != other.shape[d])
            .unwrap_or(1);
        return Err(ValidationError::TrailingDimMismatch {
            kind: first.kind,
            tensor: first.tensor_name.clone(),
            dim,
            rank_a: first.rank,
            a: first.shape.clone(),
            rank_b: other.rank,
            b: other.shape.clone(),
        });
    }
    // The sizes may differ per rank, so each rank's count must fit.
    sorted.iter().try_for_each(|r| element_count(r).map(drop))
}

fn element_count(request: &Request) -> Result<u64, ValidationError> {
    request
        .checked_num_elements()
        .ok_or_else(|| ValidationError::ElementCountOverflow {
            kind: request.kind,
            tensor: request.tensor_name.clone(),
            rank: request.rank,
            shape: request.shape.clone(),
        })
}

/// The `world_size x world_size` split matrix, rank after rank, with even
/// splits written out and zeros for absent ranks.
fn alltoall_splits(sorted: &[&Request], world_size: u32) -> Result<Vec<u64>, ValidationError> {
    let size = world_size as usize;
    let mut matrix = vec![0; size * size];
    for r in sorted {
        // Shapes are non-empty: checked by `check_gather_shapes`.
        let first_dim = r.shape[0];
        let row = &mut matrix[r.rank as usize * size..][..size];
        if r.splits.is_empty() {
            if first_dim % u64::from(world_size) != 0 {
                return Err(ValidationError::UnevenSplit {
                    tensor: r.tensor_name.clone(),
                    rank: r.rank,
                    first_dim,
                    world_size,
                });
            }
            row.fill(first_dim / u64::from(world_size));
            continue;
        }
        if r.splits.len() != size {
            return Err(ValidationError::SplitCount {
                tensor: r.tensor_name.clone(),
                rank: r.rank,
                splits: r.splits.clone(),
                world_size,
            });
        }
        let sum: u128 = r.splits.iter().map(|&s| u128::from(s)).sum();
        if sum != u128::from(first_dim) {
            return Err(ValidationError::SplitSum {
                tensor: r.tensor_name.clone(),
                rank: r.rank,
                splits: r.splits.clone(),
                sum,
                first_dim,
            });
        }
        row.copy_from_slice(&r.splits);
    }
    Ok(matrix)
}
