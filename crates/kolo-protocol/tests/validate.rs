//! Validation: the op responses, and one test per mismatch naming the
//! tensor, both values and both ranks.

use kolo_protocol::{
    try_validate, validate, DataType, Device, ReduceOp, Request, RequestKind, Response,
    ResponseKind, ValidationError,
};

fn req(rank: u32, kind: RequestKind, shape: &[u64]) -> Request {
    Request::new(rank, "grad/w", kind, DataType::F32, shape.to_vec())
}

/// `world_size` identical requests, one per rank.
fn all(kind: RequestKind, shape: &[u64], world_size: u32) -> Vec<Request> {
    (0..world_size).map(|rank| req(rank, kind, shape)).collect()
}

/// Asserts an error response whose message contains every needle.
fn assert_error(requests: &[Request], world_size: u32, needles: &[&str]) -> Response {
    let response = validate(requests, world_size);
    assert_eq!(response.kind, ResponseKind::Error, "{response:?}");
    assert_eq!(response.tensor_names, vec![requests[0].tensor_name.clone()]);
    for needle in needles {
        assert!(
            response.error_message.contains(needle),
            "{:?} lacks {needle:?}",
            response.error_message
        );
    }
    response
}

#[test]
fn allreduce_fills_the_response() {
    let mut requests = all(RequestKind::Allreduce, &[2, 3], 3);
    for r in &mut requests {
        r.reduce_op = ReduceOp::Average;
        r.prescale = 0.5;
        r.postscale = 2.0;
        r.device = Device::Cuda(r.rank);
    }
    requests.reverse();
    let response = validate(&requests, 3);
    assert_eq!(response.kind, ResponseKind::Op(RequestKind::Allreduce));
    assert_eq!(response.tensor_names, vec!["grad/w".to_string()]);
    assert_eq!(response.error_message, "");
    assert_eq!(response.dtype, DataType::F32);
    assert_eq!(
        response.devices,
        vec![Device::Cuda(0), Device::Cuda(1), Device::Cuda(2)]
    );
    assert_eq!(response.reduce_op, ReduceOp::Average);
    assert_eq!((response.prescale, response.postscale), (0.5, 2.0));
    assert_eq!(response.tensor_sizes, vec![6]);
    assert!(response.first_dims.is_empty() && response.splits.is_empty());
}

#[test]
fn broadcast_and_reduce_scatter_carry_root_and_size() {
    let mut requests = all(RequestKind::Broadcast, &[4], 2);
    for r in &mut requests {
        r.root_rank = 1;
    }
    let response = validate(&requests, 2);
    assert_eq!(response.kind, ResponseKind::Op(RequestKind::Broadcast));
    assert_eq!(
        (response.root_rank, response.tensor_sizes.clone()),
        (1, vec![4])
    );

    let response = validate(&all(RequestKind::ReduceScatter, &[4, 5], 2), 2);
    assert_eq!(response.kind, ResponseKind::Op(RequestKind::ReduceScatter));
    assert_eq!(response.tensor_sizes, vec![20]);
}

#[test]
fn allgather_collects_first_dims_in_rank_order() {
    let requests = vec![
        req(2, RequestKind::Allgather, &[7, 3]),
        req(0, RequestKind::Allgather, &[5, 3]),
    ];
    // Rank 1 joined and rank 3 has no batch left: they contribute no rows.
    let response = validate(&requests, 4);
    assert_eq!(response.kind, ResponseKind::Op(RequestKind::Allgather));
    assert_eq!(response.first_dims, vec![5, 0, 7, 0]);
    assert_eq!(response.devices, vec![Device::Cpu, Device::Cpu]);
    // The gathered tensor: (5 + 7) rows of 3 elements.
    assert_eq!(response.tensor_sizes, vec![36]);
}

#[test]
fn alltoall_writes_out_the_split_matrix() {
    let mut requests = all(RequestKind::Alltoall, &[6, 2], 3);
    requests[1].shape = vec![4, 2];
    requests[1].splits = vec![4, 0, 0];
    requests[2].shape = vec![0, 2];
    let response = validate(&requests, 3);
    assert_eq!(response.kind, ResponseKind::Op(RequestKind::Alltoall));
    assert_eq!(response.splits, vec![2, 2, 2, 4, 0, 0, 0, 0, 0]);
}

#[test]
fn barrier_and_join_check_only_kind_and_ranks() {
    for kind in [RequestKind::Barrier, RequestKind::Join] {
        let mut requests = all(kind, &[], 2);
        requests[1].dtype = DataType::I8;
        requests[1].shape = vec![9];
        let response = validate(&requests, 2);
        assert_eq!(response.kind, ResponseKind::Op(kind));
        requests[1].rank = 0;
        assert_error(&requests, 2, &["grad/w", "Rank 0", "more than one"]);
    }
}

#[test]
fn shape_mismatch_reads_like_horovod() {
    let mut requests = all(RequestKind::Allreduce, &[2, 3], 3);
    requests[2].shape = vec![3, 2];
    let response = validate(&requests, 3);
    assert_eq!(
        response.error_message,
        "Mismatched ALLREDUCE tensor shapes for tensor 'grad/w': rank 0 sent [2, 3], but rank 2 sent [3, 2]."
    );
    for kind in [RequestKind::Broadcast, RequestKind::ReduceScatter] {
        let mut requests = all(kind, &[4], 2);
        requests[1].shape = vec![5];
        assert_error(
            &requests,
            2,
            &[kind.name(), "grad/w", "rank 0 sent [4]", "rank 1 sent [5]"],
        );
    }
}

#[test]
fn the_lowest_conflicting_pair_is_reported() {
    // Ranks 1 and 3 agree with rank 0; ranks 2 and 4 differ from it.
    let mut requests = all(RequestKind::Allreduce, &[8], 5);
    requests[2].dtype = DataType::F16;
    requests[4].dtype = DataType::I64;
    requests.swap(0, 4);
    let response = assert_error(&requests, 5, &["rank 0 sent f32", "rank 2 sent f16"]);
    assert!(!response.error_message.contains("i64"));
}

#[test]
fn dtype_mismatch() {
    let mut requests = all(RequestKind::Allgather, &[1], 2);
    requests[1].dtype = DataType::BF16;
    assert_error(
        &requests,
        2,
        &[
            "ALLGATHER",
            "data types",
            "'grad/w'",
            "rank 0 sent f32",
            "rank 1 sent bf16",
        ],
    );
}

#[test]
fn kind_mismatch() {
    let mut requests = all(RequestKind::Allreduce, &[1], 2);
    requests[1].kind = RequestKind::Broadcast;
    assert_error(
        &requests,
        2,
        &[
            "'grad/w'",
            "rank 0 requested ALLREDUCE",
            "rank 1 requested BROADCAST",
        ],
    );
}

#[test]
fn reduce_op_mismatch() {
    let mut requests = all(RequestKind::ReduceScatter, &[4], 3);
    requests[1].reduce_op = ReduceOp::Max;
    assert_error(
        &requests,
        3,
        &[
            "REDUCESCATTER",
            "'grad/w'",
            "rank 0 sent sum",
            "rank 1 sent max",
        ],
    );
}

#[test]
fn scale_mismatch() {
    let mut requests = all(RequestKind::Allreduce, &[4], 2);
    requests[1].prescale = 0.25;
    assert_error(
        &requests,
        2,
        &[
            "prescale",
            "'grad/w'",
            "rank 0 sent 1.0",
            "rank 1 sent 0.25",
        ],
    );
    let mut requests = all(RequestKind::Allreduce, &[4], 2);
    requests[0].postscale = -0.0;
    requests[1].postscale = 0.0;
    assert_error(
        &requests,
        2,
        &["postscale", "rank 0 sent -0.0", "rank 1 sent 0.0"],
    );
    // NaN equals itself bitwise: no mismatch, no nondeterminism.
    let mut requests = all(RequestKind::Allreduce, &[4], 2);
    requests.iter_mut().for_each(|r| r.postscale = f64::NAN);
    assert!(!validate(&requests, 2).is_error());
}

#[test]
fn cpu_gpu_mix() {
    let mut requests = all(RequestKind::Allreduce, &[4], 3);
    requests[0].device = Device::Cuda(0);
    requests[1].device = Device::Cuda(1);
    assert_error(
        &requests,
        3,
        &[
            "CPU/GPU",
            "'grad/w'",
            "rank 0 sent cuda:0",
            "rank 2 sent cpu",
        ],
    );
}

#[test]
fn allgather_shape_errors() {
    let mut requests = all(RequestKind::Allgather, &[4, 3], 3);
    requests[2].shape = vec![];
    assert_error(
        &requests,
        3,
        &["ALLGATHER", "'grad/w'", "rank 2 sent a scalar"],
    );
    requests[2].shape = vec![4, 3, 1];
    assert_error(
        &requests,
        3,
        &[
            "tensor ranks",
            "rank 0 sent [4, 3] (2 dimensions)",
            "rank 2 sent [4, 3, 1] (3 dimensions)",
        ],
    );
    requests[2].shape = vec![9, 5];
    assert_error(
        &requests,
        3,
        &[
            "dimension 1",
            "'grad/w'",
            "rank 0 sent [4, 3]",
            "rank 2 sent [9, 5]",
        ],
    );
}

#[test]
fn root_rank_errors() {
    let mut requests = all(RequestKind::Broadcast, &[4], 3);
    requests[1].root_rank = 2;
    assert_error(
        &requests,
        3,
        &[
            "root ranks",
            "'grad/w'",
            "rank 0 sent root 0",
            "rank 1 sent root 2",
        ],
    );
    requests.iter_mut().for_each(|r| r.root_rank = 3);
    assert_error(
        &requests,
        3,
        &["'grad/w'", "root rank 3", "world size is 3"],
    );
}

#[test]
fn duplicate_and_out_of_range_ranks() {
    let mut requests = all(RequestKind::Allreduce, &[4], 3);
    requests[2].rank = 1;
    assert_error(
        &requests,
        3,
        &["Rank 1", "more than one request", "'grad/w'"],
    );
    let mut requests = all(RequestKind::Allreduce, &[4], 3);
    requests[1].rank = 7;
    requests[2].rank = 5;
    assert_error(&requests, 3, &["Rank 5", "'grad/w'", "world size is 3"]);
}

#[test]
fn reduce_scatter_of_a_scalar() {
    assert_error(
        &all(RequestKind::ReduceScatter, &[], 2),
        2,
        &["REDUCESCATTER", "'grad/w'", "rank 0 sent a scalar"],
    );
}

#[test]
fn alltoall_split_errors() {
    let mut requests = all(RequestKind::Alltoall, &[6, 2], 4);
    assert_error(
        &requests,
        4,
        &["'grad/w'", "rank 0", "first dimension 6", "4 ranks"],
    );
    requests.iter_mut().for_each(|r| r.shape = vec![8, 2]);
    requests[1].splits = vec![4, 4];
    assert_error(
        &requests,
        4,
        &["'grad/w'", "rank 1 sent 2 splits [4, 4]", "world size is 4"],
    );
    requests[1].splits = vec![4, 4, 1, 0];
    assert_error(
        &requests,
        4,
        &[
            "'grad/w'",
            "rank 1 sent splits [4, 4, 1, 0] summing to 9",
            "first dimension is 8",
        ],
    );
    requests[1].splits = vec![u64::MAX, u64::MAX, 0, 0];
    assert_error(&requests, 4, &["summing to 36893488147419103230"]);
    requests[1].splits = vec![2, 2, 2, 2];
    requests[3].shape = vec![8, 3];
    assert_error(
        &requests,
        4,
        &[
            "ALLTOALL",
            "dimension 1",
            "rank 0 sent [8, 2]",
            "rank 3 sent [8, 3]",
        ],
    );
}

#[test]
fn mismatched_names_and_no_requests() {
    let mut requests = all(RequestKind::Allreduce, &[4], 2);
    requests[1].tensor_name = "grad/b".into();
    assert_error(
        &requests,
        2,
        &["rank 0 sent 'grad/w'", "rank 1 sent 'grad/b'"],
    );
    assert_eq!(try_validate(&[], 2), Err(ValidationError::NoRequests));
    assert!(validate(&[], 2).is_error());
}

#[test]
fn overflowing_element_counts_are_errors() {
    let huge = [u64::MAX, 2];
    assert_error(
        &all(RequestKind::Allreduce, &huge, 2),
        2,
        &["'grad/w'", "overflows", "rank 0"],
    );
    let mut requests = all(RequestKind::Allgather, &[1, 1 << 40], 2);
    requests[1].shape = vec![1 << 40, 1 << 40];
    requests[0].shape = vec![1, 1 << 40];
    assert_error(
        &requests,
        2,
        &["rank 1 sent shape [1099511627776, 1099511627776]"],
    );
    assert_eq!(requests[1].num_elements(), u64::MAX);
    assert_eq!(requests[1].checked_num_elements(), None);
}

#[test]
fn typed_error_carries_the_values() {
    let mut requests = all(RequestKind::Allreduce, &[2, 3], 3);
    requests[1].shape = vec![6];
    assert_eq!(
        try_validate(&requests, 3),
        Err(ValidationError::ShapeMismatch {
            kind: RequestKind::Allreduce,
            tensor: "grad/w".into(),
            rank_a: 0,
            a: vec![2, 3],
            rank_b: 1,
            b: vec![6],
        })
    );
}
