//! Fusion planning: which ready responses run as one collective.
//!
//! Pure and deterministic: every rank plans the same responses into the same
//! fused list without talking to the others.

use kolo_protocol::{RequestKind, Response, ResponseKind};

/// How a response may fuse: its kind and, for allgathers, the world size
/// its `first_dims` carries; `None` when it always runs alone (errors,
/// kinds that do not fuse, and responses whose size lists do not match
/// their names: those never fuse rather than guess).
fn fusion_kind(response: &Response) -> Option<(RequestKind, usize)> {
    let ResponseKind::Op(kind) = response.kind else {
        return None;
    };
    let names = response.tensor_names.len();
    if names == 0 || response.tensor_sizes.len() != names {
        return None;
    }
    match kind {
        RequestKind::Allreduce | RequestKind::ReduceScatter => Some((kind, 0)),
        RequestKind::Allgather => {
            // `first_dims` holds every rank's first dimension for each
            // tensor (ranks that joined included), so its length fixes
            // the world size that members must share.
            let ranks = response.first_dims.len() / names;
            (ranks > 0 && ranks * names == response.first_dims.len()).then_some((kind, ranks))
        }
        _ => None,
    }
}

/// True when `a` and `b` (both fusible, see [`fusion_kind`]) may share one
/// fused collective: same kind, dtype and devices, and for reductions the
/// same reduce op, scale factors (bit for bit) and compression; for
/// allgathers the same world size.
fn same_class(a: &Response, b: &Response) -> bool {
    let (Some((kind, ranks)), Some((other_kind, other_ranks))) = (fusion_kind(a), fusion_kind(b))
    else {
        return false;
    };
    let reduces = kind != RequestKind::Allgather;
    kind == other_kind
        && ranks == other_ranks
        && a.dtype == b.dtype
        && a.devices == b.devices
        && (!reduces
            || (a.reduce_op == b.reduce_op
                && a.prescale.to_bits() == b.prescale.to_bits()
                && a.postscale.to_bits() == b.postscale.to_bits()
                && a.compression == b.compression))
}

/// Bytes that `response` occupies in a fusion buffer: the sum of its
/// `tensor_sizes` times the element size. For an allgather, `tensor_sizes[i]`
/// must count the elements of gathered tensor i (every rank's rows); an
/// allgather without `tensor_sizes` never fuses.
pub fn fused_bytes(response: &Response) -> u128 {
    let elements: u128 = response.tensor_sizes.iter().map(|&n| u128::from(n)).sum();
    elements * response.dtype.size() as u128
}

/// Which responses of a cycle run as one collective: groups of indices
/// into the planned list, each ascending, in the order of their first
/// member (see [`plan_groups`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FusionPlan {
    /// Every response's index, group after group.
    order: Vec<usize>,
    /// Where each group ends in `order`.
    ends: Vec<usize>,
}

impl FusionPlan {
    /// The groups, in order: each a list of response indices.
    pub fn groups(&self) -> impl Iterator<Item = &[usize]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let group = &self.order[start..end];
            start = end;
            group
        })
    }

    /// Number of groups (collectives to run).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// A group still accepting members of its class.
struct OpenGroup {
    /// Index of the response whose class the group has.
    head: usize,
    /// The group's number.
    group: usize,
    bytes: u128,
}

/// Decides which ready responses (in agreed order) fuse.
///
/// Allreduces with the same dtype, reduce op, scale factors and devices join
/// (in order) while the group's total stays within `threshold_bytes`;
/// reduce-scatters join under the same rule, and allgathers with the same
/// dtype, devices and world size join (an allgather fuses only when its
/// `tensor_sizes` give the gathered element counts, see [`fused_bytes`]). A
/// group looks past responses of other classes (Horovod's look-ahead) and
/// runs at the position of its first member; the others keep their
/// relative order. Within a class, tensors keep their order: a member that
/// would overflow the group closes it and starts the next one. A response
/// larger than the threshold runs alone; `threshold_bytes == 0` disables
/// fusion; error responses never fuse.
///
/// Pure and deterministic: every rank computes the same plan. Costs a few
/// comparisons per response and no allocation per response.
pub fn plan_groups(responses: &[&Response], threshold_bytes: usize) -> FusionPlan {
    let n = responses.len();
    if threshold_bytes == 0 {
        return FusionPlan {
            order: (0..n).collect(),
            ends: (1..=n).collect(),
        };
    }
    let threshold = threshold_bytes as u128;
    let mut group_of = Vec::with_capacity(n);
    let mut sizes: Vec<usize> = Vec::new();
    let mut open: Vec<OpenGroup> = Vec::new();
    for (index, &response) in responses.iter().enumerate() {
        let bytes = fused_bytes(response);
        let fusible = fusion_kind(response).is_some();
        let class = if fusible {
            open.iter()
                .position(|g| same_class(responses[g.head], response))
        } else {
            None
        };
        if let Some(at) = class {
            let g = &mut open[at];
            if g.bytes + bytes <= threshold {
                g.bytes += bytes;
                group_of.push(g.group);
                sizes[g.group] += 1;
                continue;
            }
            // Full: the class's next group starts here (the class keeps its
            // order), unless this response is too large to take anyone.
            open.swap_remove(at);
        }
        let group = sizes.len();
        sizes.push(1);
        group_of.push(group);
        if fusible && bytes <= threshold {
            open.push(OpenGroup {
                head: index,
                group,
                bytes,
            });
        }
    }
    // Counting sort of the indices by group (stable: members ascend).
    let mut ends = Vec::with_capacity(sizes.len());
    let mut end = 0;
    for &size in &sizes {
        end += size;
        ends.push(end);
    }
    let mut next: Vec<usize> = ends.iter().zip(&sizes).map(|(e, s)| e - s).collect();
    let mut order = vec![0; n];
    for (index, &group) in group_of.iter().enumerate() {
        order[next[group]] = index;
        next[group] += 1;
    }
    FusionPlan { order, ends }
}

/// The fused response of `members` (one class, see [`plan_groups`]): the
/// first member's parameters with every member's names, sizes and (for
/// allgathers, tensor after tensor) first dimensions concatenated.
pub fn fuse(members: &[&Response]) -> Response {
    let Some((&first, rest)) = members.split_first() else {
        return Response::error(String::new(), "internal: an empty fused response");
    };
    let mut fused = first.clone();
    for member in rest {
        fused
            .tensor_names
            .extend(member.tensor_names.iter().cloned());
        fused.tensor_sizes.extend_from_slice(&member.tensor_sizes);
        fused.first_dims.extend_from_slice(&member.first_dims);
    }
    fused
}

/// Fuses ready responses (in agreed order) into fewer responses:
/// [`plan_groups`], then [`fuse`] for each group.
pub fn plan(responses: Vec<Response>, threshold_bytes: usize) -> Vec<Response> {
    let refs: Vec<&Response> = responses.iter().collect();
    let groups = plan_groups(&refs, threshold_bytes);
    groups
        .groups()
        .map(|members| {
            let members: Vec<&Response> = members.iter().map(|&i| refs[i]).collect();
            fuse(&members)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::{DataType, Device, ReduceOp};
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// The plan as first written (kept as the reference): a map from the
    /// full fusion class to the open group, fused responses built as it
    /// goes.
    fn reference_plan(responses: Vec<Response>, threshold_bytes: usize) -> Vec<Response> {
        #[derive(PartialEq, Eq, Hash)]
        struct Class {
            kind: RequestKind,
            dtype: DataType,
            reduce_op: Option<ReduceOp>,
            scales: Option<(u64, u64)>,
            compression: Option<kolo_protocol::Compression>,
            devices: Vec<Device>,
            ranks: usize,
        }
        if threshold_bytes == 0 {
            return responses;
        }
        let threshold = threshold_bytes as u128;
        let mut out: Vec<Response> = Vec::new();
        let mut open: HashMap<Class, (usize, u128)> = HashMap::new();
        for response in responses {
            let Some((kind, ranks)) = fusion_kind(&response) else {
                out.push(response);
                continue;
            };
            let reduces = kind != RequestKind::Allgather;
            let class = Class {
                kind,
                dtype: response.dtype,
                reduce_op: reduces.then_some(response.reduce_op),
                scales: reduces
                    .then(|| (response.prescale.to_bits(), response.postscale.to_bits())),
                compression: reduces.then_some(response.compression),
                devices: response.devices.clone(),
                ranks,
            };
            let bytes = fused_bytes(&response);
            if let Some((slot, total)) = open.get_mut(&class) {
                if *total + bytes <= threshold {
                    *total += bytes;
                    let group = &mut out[*slot];
                    group.tensor_names.extend(response.tensor_names);
                    group.tensor_sizes.extend(response.tensor_sizes);
                    group.first_dims.extend(response.first_dims);
                    continue;
                }
            }
            if bytes <= threshold {
                open.insert(class, (out.len(), bytes));
            } else {
                open.remove(&class);
            }
            out.push(response);
        }
        out
    }

    fn any_response() -> impl Strategy<Value = Response> {
        (
            0u8..4,
            0u8..3,
            1u64..40,
            0u8..2,
            prop_oneof![Just(1.0f64), Just(0.5)],
            0usize..1000,
        )
            .prop_map(|(kind, op, elements, dtype, postscale, n)| {
                let name = format!("t{n}");
                let mut r = allreduce(&name, elements);
                r.dtype = [DataType::F32, DataType::F16][dtype as usize];
                r.reduce_op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min][op as usize];
                r.postscale = postscale;
                match kind {
                    0 => {}
                    1 => r.kind = ResponseKind::Op(RequestKind::ReduceScatter),
                    2 => {
                        r.kind = ResponseKind::Op(RequestKind::Allgather);
                        r.first_dims = vec![elements / 2, elements - elements / 2];
                    }
                    _ => r.kind = ResponseKind::Error,
                }
                r
            })
    }

    proptest! {
        /// The index plan fused back into responses is the reference plan,
        /// and every response appears exactly once, members ascending.
        #[test]
        fn groups_match_the_reference(
            responses in prop::collection::vec(any_response(), 0..60),
            threshold in prop_oneof![Just(0usize), Just(16), Just(100), Just(1000), Just(1 << 20)],
        ) {
            let refs: Vec<&Response> = responses.iter().collect();
            let groups = plan_groups(&refs, threshold);
            let mut seen: Vec<usize> = groups.groups().flatten().copied().collect();
            for group in groups.groups() {
                prop_assert!(group.windows(2).all(|w| w[0] < w[1]));
            }
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..responses.len()).collect::<Vec<_>>());
            prop_assert_eq!(plan(responses.clone(), threshold), reference_plan(responses, threshold));
        }
    }

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
