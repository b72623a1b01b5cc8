//! Fusion planning: which ready responses run as one collective.
//!
//! Pure and deterministic: every rank plans the same responses into the same
//! fused list without talking to the others.

use kolo_protocol::{DataType, Device, ReduceOp, RequestKind, Response, ResponseKind};
use std::collections::HashMap;

/// What must be equal for two responses to share one fused collective.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct FusionClass {
    kind: RequestKind,
    dtype: DataType,
    /// `None` for allgathers (no reduction).
    reduce_op: Option<ReduceOp>,
    /// Bit patterns of the scale factors (`None` for allgathers): exact
    /// equality, and hashable.
    scales: Option<(u64, u64)>,
    devices: Vec<Device>,
    /// Allgather: entries of `first_dims` per tensor (the world size); 0
    /// otherwise.
    ranks: usize,
}

/// The fusion class of `response`, or `None` when it always runs alone:
/// errors, kinds that do not fuse, and responses whose size lists do not
/// match their names (those never fuse rather than guess).
fn fusion_class(response: &Response) -> Option<FusionClass> {
    let ResponseKind::Op(kind) = response.kind else {
        return None;
    };
    let names = response.tensor_names.len();
    if names == 0 || response.tensor_sizes.len() != names {
        return None;
    }
    let (reduces, ranks) = match kind {
        RequestKind::Allreduce | RequestKind::ReduceScatter => (true, 0),
        RequestKind::Allgather => {
            // `first_dims` holds every rank's first dimension for each
            // tensor (ranks that joined included), so its length fixes
            // the world size that members must share.
            let ranks = response.first_dims.len() / names;
            if ranks == 0 || ranks * names != response.first_dims.len() {
                return None;
            }
            (false, ranks)
        }
        _ => return None,
    };
    Some(FusionClass {
        kind,
        dtype: response.dtype,
        reduce_op: reduces.then_some(response.reduce_op),
        scales: reduces.then(|| (response.prescale.to_bits(), response.postscale.to_bits())),
        devices: response.devices.clone(),
        ranks,
    })
}

/// Bytes that `response` occupies in a fusion buffer: the sum of its
/// `tensor_sizes` times the element size. For an allgather, `tensor_sizes[i]`
/// must count the elements of gathered tensor i (every rank's rows); an
/// allgather without `tensor_sizes` never fuses.
pub fn fused_bytes(response: &Response) -> u128 {
    let elements: u128 = response.tensor_sizes.iter().map(|&n| u128::from(n)).sum();
    elements * response.dtype.size() as u128
}

/// Appends `member`'s tensors to the fused response `group`.
fn absorb(group: &mut Response, member: Response) {
    group.tensor_names.extend(member.tensor_names);
    group.tensor_sizes.extend(member.tensor_sizes);
    // Allgather: tensor after tensor, each `size` ranks long.
    group.first_dims.extend(member.first_dims);
}

/// A group still accepting members of its class.
struct OpenGroup {
    /// Index of the group in the output.
    slot: usize,
    bytes: u128,
}

/// Fuses ready responses (in agreed order) into fewer responses.
///
/// Allreduces with the same dtype, reduce op, scale factors and devices join
/// (names and sizes concatenated in order) while the group's total stays
/// within `threshold_bytes`; reduce-scatters join under the same rule, and
/// allgathers with the same dtype, devices and world size join with their
/// `first_dims` concatenated tensor after tensor (an allgather fuses only
/// when its `tensor_sizes` give the gathered element counts, see
/// [`fused_bytes`]). A group looks past responses of other
/// classes (Horovod's look-ahead) and appears at the position of its first
/// member; the others keep their relative order. Within a class, tensors
/// keep their order: a member that would overflow the group closes it and
/// starts the next one. A response larger than the threshold runs alone;
/// `threshold_bytes == 0` disables fusion; error responses never fuse.
///
/// Pure and deterministic: every rank computes the same plan.
pub fn plan(responses: Vec<Response>, threshold_bytes: usize) -> Vec<Response> {
    if threshold_bytes == 0 {
        return responses;
    }
    let threshold = threshold_bytes as u128;
    let mut out: Vec<Response> = Vec::with_capacity(responses.len());
    let mut open: HashMap<FusionClass, OpenGroup> = HashMap::new();
    for response in responses {
        let Some(class) = fusion_class(&response) else {
            out.push(response);
            continue;
        };
        let bytes = fused_bytes(&response);
        if let Some(group) = open.get_mut(&class) {
            if group.bytes + bytes <= threshold {
                group.bytes += bytes;
                absorb(&mut out[group.slot], response);
                continue;
            }
        }
        // Starts a new group (closing a full one of the same class, which
        // keeps the class's tensors in order). An oversized response can
        // take nobody else.
        if bytes <= threshold {
            open.insert(
                class,
                OpenGroup {
                    slot: out.len(),
                    bytes,
                },
            );
        } else {
            open.remove(&class);
        }
        out.push(response);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allreduce(name: &str, elements: u64) -> Response {
        Response {
            kind: ResponseKind::Op(RequestKind::Allreduce),
            tensor_names: vec![name.to_string()],
            dtype: DataType::F32,
            devices: vec![Device::Cpu; 2],
            tensor_sizes: vec![elements],
            ..Response::error(name, "")
        }
    }

    fn names(plan: &[Response]) -> Vec<Vec<&str>> {
        plan.iter()
            .map(|r| r.tensor_names.iter().map(String::as_str).collect())
            .collect()
    }

    #[test]
    fn fuses_up_to_the_threshold_in_order() {
        let input = vec![allreduce("a", 4), allreduce("b", 4), allreduce("c", 4)];
        let fused = plan(input, 32);
        assert_eq!(names(&fused), vec![vec!["a", "b"], vec!["c"]]);
        assert_eq!(fused[0].tensor_sizes, vec![4, 4]);
    }

    #[test]
    fn looks_past_other_classes() {
        let mut max = allreduce("m", 1);
        max.reduce_op = ReduceOp::Max;
        let input = vec![
            allreduce("a", 1),
            max,
            Response::error("e", "bad"),
            allreduce("b", 1),
        ];
        let fused = plan(input, 1024);
        assert_eq!(names(&fused), vec![vec!["a", "b"], vec!["m"], vec!["e"]]);
    }

    #[test]
    fn oversized_tensor_goes_alone_and_closes_the_group() {
        let input = vec![allreduce("a", 1), allreduce("big", 100), allreduce("b", 1)];
        let fused = plan(input, 16);
        assert_eq!(names(&fused), vec![vec!["a"], vec!["big"], vec!["b"]]);
    }

    #[test]
    fn exact_threshold_fits() {
        let fused = plan(vec![allreduce("a", 2), allreduce("b", 2)], 16);
        assert_eq!(names(&fused), vec![vec!["a", "b"]]);
    }

    #[test]
    fn allgathers_concatenate_first_dims() {
        let gather = |name: &str, dims: [u64; 2]| Response {
            kind: ResponseKind::Op(RequestKind::Allgather),
            first_dims: dims.to_vec(),
            reduce_op: ReduceOp::Max,
            ..allreduce(name, dims.iter().sum())
        };
        let mut other_op = gather("y", [3, 4]);
        other_op.reduce_op = ReduceOp::Sum;
        let fused = plan(vec![gather("x", [1, 2]), other_op], 1024);
        assert_eq!(names(&fused), vec![vec!["x", "y"]]);
        assert_eq!(fused[0].first_dims, vec![1, 2, 3, 4]);
    }

    #[test]
    fn malformed_sizes_never_fuse() {
        let mut odd = allreduce("odd", 1);
        odd.tensor_sizes.clear();
        let fused = plan(vec![allreduce("a", 1), odd, allreduce("b", 1)], 1024);
        assert_eq!(names(&fused), vec![vec!["a", "b"], vec!["odd"]]);
    }
}
