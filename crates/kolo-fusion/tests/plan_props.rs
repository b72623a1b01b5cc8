//! Properties of the fusion plan over random response lists.

use kolo_fusion::{fused_bytes, plan};
use kolo_protocol::{DataType, Device, ReduceOp, RequestKind, Response, ResponseKind};
use proptest::prelude::*;
use std::collections::HashMap;

const WORLD: usize = 2;

/// One unfused response for tensor `t{index}`.
fn response(
    index: usize,
    kind: u8,
    dtype: DataType,
    op: ReduceOp,
    prescale: f64,
    gpu: bool,
    size: u64,
) -> Response {
    let devices = if gpu {
        vec![Device::Cuda(0), Device::Cuda(1)]
    } else {
        vec![Device::Cpu; WORLD]
    };
    let name = format!("t{index}");
    let base = Response {
        dtype,
        devices,
        reduce_op: op,
        prescale,
        tensor_sizes: vec![size],
        ..Response::error(name.clone(), "")
    };
    match kind {
        0 => Response {
            kind: ResponseKind::Op(RequestKind::Allreduce),
            ..base
        },
        1 => Response {
            kind: ResponseKind::Op(RequestKind::ReduceScatter),
            ..base
        },
        2 => Response {
            kind: ResponseKind::Op(RequestKind::Allgather),
            first_dims: vec![size / 2, size - size / 2],
            ..base
        },
        3 => Response {
            kind: ResponseKind::Op(RequestKind::Broadcast),
            ..base
        },
        _ => Response::error(name, "mismatched shapes"),
    }
}

fn responses() -> impl Strategy<Value = Vec<Response>> {
    let one = (
        0u8..5,
        prop::sample::select(vec![DataType::F32, DataType::F64, DataType::U8]),
        prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Max]),
        prop::sample::select(vec![1.0, 0.5]),
        any::<bool>(),
        0u64..64,
    );
    prop::collection::vec(one, 0..40).prop_map(|items| {
        items
            .into_iter()
            .enumerate()
            .map(|(i, (kind, dtype, op, prescale, gpu, size))| {
                response(i, kind, dtype, op, prescale, gpu, size)
            })
            .collect()
    })
}

fn threshold() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), 1usize..600, Just(usize::MAX)]
}

/// The test's own notion of what may fuse: `None` for what never does.
fn class(r: &Response) -> Option<String> {
    match r.kind {
        ResponseKind::Op(RequestKind::Allreduce) | ResponseKind::Op(RequestKind::ReduceScatter) => {
            Some(format!(
                "{:?} {:?} {:?} {} {} {:?}",
                r.kind, r.dtype, r.reduce_op, r.prescale, r.postscale, r.devices
            ))
        }
        ResponseKind::Op(RequestKind::Allgather) => {
            Some(format!("{:?} {:?} {:?}", r.kind, r.dtype, r.devices))
        }
        _ => None,
    }
}

fn by_name(input: &[Response]) -> HashMap<&str, &Response> {
    input
        .iter()
        .map(|r| (r.tensor_names[0].as_str(), r))
        .collect()
}

proptest! {
    #[test]
    fn every_tensor_appears_once_with_its_size(input in responses(), threshold in threshold()) {
        let output = plan(input.clone(), threshold);
        let mut names: Vec<&String> = output.iter().flat_map(|r| &r.tensor_names).collect();
        names.sort();
        let mut expected: Vec<&String> = input.iter().flat_map(|r| &r.tensor_names).collect();
        expected.sort();
        prop_assert_eq!(names, expected);
        let originals = by_name(&input);
        for group in &output {
            prop_assert!(group.tensor_sizes.is_empty() || group.tensor_sizes.len() == group.tensor_names.len());
            for (i, name) in group.tensor_names.iter().enumerate() {
                prop_assert_eq!(group.tensor_sizes.get(i), originals[name.as_str()].tensor_sizes.first());
            }
        }
    }

    #[test]
    fn groups_are_homogeneous_and_within_the_threshold(input in responses(), threshold in threshold()) {
        let originals = by_name(&input);
        for group in plan(input.clone(), threshold) {
            if group.tensor_names.len() < 2 {
                continue;
            }
            prop_assert!(fused_bytes(&group) <= threshold as u128);
            let group_class = class(&group);
            prop_assert!(group_class.is_some(), "{:?} fused", group.kind);
            let mut first_dims = Vec::new();
            for name in &group.tensor_names {
                let member = originals[name.as_str()];
                prop_assert_eq!(&class(member), &group_class);
                first_dims.extend(&member.first_dims);
            }
            prop_assert_eq!(group.first_dims, first_dims);
        }
    }

    #[test]
    fn threshold_zero_is_the_identity(input in responses()) {
        prop_assert_eq!(plan(input.clone(), 0), input);
    }

    #[test]
    fn order_is_kept_within_classes_and_groups_sit_at_their_first_member(
        input in responses(),
        threshold in threshold(),
    ) {
        let output = plan(input.clone(), threshold);
        let originals = by_name(&input);
        let flat: Vec<&String> = output.iter().flat_map(|r| &r.tensor_names).collect();
        let classes: Vec<Option<String>> = input.iter().map(class).collect();
        for c in classes.iter().flatten() {
            let in_class = |name: &&String| class(originals[name.as_str()]).as_ref() == Some(c);
            let before: Vec<&String> = input.iter().map(|r| &r.tensor_names[0]).filter(in_class).collect();
            let after: Vec<&String> = flat.iter().copied().filter(in_class).collect();
            prop_assert_eq!(before, after);
        }
        // The first tensors of the output responses appear in input order.
        let position: HashMap<&String, usize> =
            input.iter().enumerate().map(|(i, r)| (&r.tensor_names[0], i)).collect();
        let firsts: Vec<usize> = output.iter().map(|r| position[&r.tensor_names[0]]).collect();
        prop_assert!(firsts.windows(2).all(|w| w[0] < w[1]), "{:?}", firsts);
    }

    #[test]
    fn groups_are_greedy(input in responses(), threshold in 1usize..600) {
        // Within a class, a group ends only because the next member would
        // not fit.
        let output = plan(input, threshold);
        let mut last: HashMap<String, u128> = HashMap::new();
        for group in &output {
            let Some(c) = class(group) else { continue };
            let first = Response {
                tensor_sizes: group.tensor_sizes[..1].to_vec(),
                ..group.clone()
            };
            if let Some(previous) = last.get(&c) {
                prop_assert!(previous + fused_bytes(&first) > threshold as u128);
            }
            last.insert(c, fused_bytes(group));
        }
    }

    #[test]
    fn plans_are_deterministic(input in responses(), threshold in threshold()) {
        prop_assert_eq!(plan(input.clone(), threshold), plan(input, threshold));
    }
}
