//! The execution helpers on single-rank backends of [`crate::testing`]:
//! their phases, the paths they take and their errors, without any real
//! backend.

use super::{fused_allgather, fused_allreduce, fused_reduce_scatter, Edge, Phase};
use crate::testing::{InPlaceLoopback, Loopback, ShortAllocator};
use crate::{FusionBuffers, FusionError};
use kolo_protocol::{Device, ReduceOp};
use kolo_transport::{Collectives, Host, Scale};

/// Records the observed phases.
fn recorder(log: &mut Vec<(Phase, Edge)>) -> impl FnMut(Phase, Edge) + '_ {
    move |phase, edge| log.push((phase, edge))
}

const FUSED: [(Phase, Edge); 6] = [
    (Phase::MemcpyInFusionBuffer, Edge::Start),
    (Phase::MemcpyInFusionBuffer, Edge::End),
    (Phase::Collective, Edge::Start),
    (Phase::Collective, Edge::End),
    (Phase::MemcpyOutFusionBuffer, Edge::Start),
    (Phase::MemcpyOutFusionBuffer, Edge::End),
];
const ALONE: [(Phase, Edge); 2] = [
    (Phase::Collective, Edge::Start),
    (Phase::Collective, Edge::End),
];

#[test]
fn allreduce_scales_each_tensor_and_reports_phases() {
    let mut comm = Loopback::default();
    let mut bufs = FusionBuffers::new();
    let (mut a, mut b) = (vec![1.0f64, 2.0], vec![3.0f64]);
    let mut log = Vec::new();
    let scale = Scale {
        prescale: 2.0,
        postscale: 0.5,
    };
    fused_allreduce(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &mut [&mut a, &mut b],
        ReduceOp::Average,
        scale,
        &mut recorder(&mut log),
    )
    .unwrap();
    assert_eq!((a, b), (vec![1.0, 2.0], vec![3.0]));
    assert_eq!(log, FUSED);
    assert_eq!(bufs.bytes_allocated(), 3 * 8);

    let mut c = vec![5i32, -7];
    let mut log = Vec::new();
    let scale = Scale {
        prescale: 3.0,
        postscale: 1.0,
    };
    fused_allreduce(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &mut [&mut c],
        ReduceOp::Sum,
        scale,
        &mut recorder(&mut log),
    )
    .unwrap();
    assert_eq!(c, vec![15, -21]);
    assert_eq!(log, ALONE);
    assert_eq!(
        bufs.bytes_allocated(),
        3 * 8,
        "a single tensor needs no fusion buffer"
    );
}

#[test]
fn allreduce_on_in_place_segments_is_one_collective_without_a_buffer() {
    let mut comm = InPlaceLoopback::default();
    let mut bufs = FusionBuffers::new();
    let (mut a, mut b, mut c) = (vec![1.0f64, 2.0], vec![], vec![3.0f64]);
    let mut log = Vec::new();
    let scale = Scale {
        prescale: 2.0,
        postscale: 1.5,
    };
    fused_allreduce(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &mut [&mut a, &mut b, &mut c],
        ReduceOp::Sum,
        scale,
        &mut recorder(&mut log),
    )
    .unwrap();
    assert_eq!((a, b, c), (vec![3.0, 6.0], vec![], vec![9.0]));
    assert_eq!(log, ALONE, "no MEMCPY phases");
    assert_eq!(comm.segment_calls, 1, "one allreduce_segments");
    assert_eq!(bufs.bytes_allocated(), 0, "no fusion buffer");

    // A single tensor still takes plain allreduce.
    let mut d = vec![5i32];
    fused_allreduce(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &mut [&mut d],
        ReduceOp::Sum,
        Scale::NONE,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!((d, comm.segment_calls), (vec![5], 1));
}

#[test]
fn allgather_of_one_rank_returns_the_inputs() {
    let mut comm = Loopback::default();
    let mut bufs = FusionBuffers::new();
    let (a, b) = ([1i64, 2, 3, 4, 5, 6], [7i64]);
    let mut log = Vec::new();
    let out = fused_allgather(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&a, &b],
        &[2, 1],
        &[3, 1],
        &mut recorder(&mut log),
    )
    .unwrap();
    assert_eq!(out, vec![a.to_vec(), b.to_vec()]);
    assert_eq!(log, FUSED);

    let mut log = Vec::new();
    let out = fused_allgather(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&b],
        &[1],
        &[1],
        &mut recorder(&mut log),
    )
    .unwrap();
    assert_eq!(out, vec![b.to_vec()]);
    assert_eq!(log, ALONE);
}

#[test]
fn reduce_scatter_of_one_rank_keeps_everything() {
    let mut comm = Loopback::default();
    let mut bufs = FusionBuffers::new();
    let (a, b) = ([1.0f32, 2.0], [3.0f32, 4.0, 5.0]);
    let (mut oa, mut ob) = ([0.0f32; 2], [0.0f32; 3]);
    let mut log = Vec::new();
    let scale = Scale {
        prescale: 1.0,
        postscale: 2.0,
    };
    fused_reduce_scatter(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&a, &b],
        &mut [&mut oa, &mut ob],
        &[vec![2], vec![3]],
        ReduceOp::Sum,
        scale,
        &mut recorder(&mut log),
    )
    .unwrap();
    assert_eq!((oa, ob), ([2.0, 4.0], [6.0, 8.0, 10.0]));
    assert_eq!(log, FUSED);
}

#[test]
fn empty_responses_do_nothing() {
    let mut comm = Loopback::default();
    let mut bufs = FusionBuffers::new();
    let mut log = Vec::new();
    fused_allreduce::<Host, _, f32>(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &mut [],
        ReduceOp::Sum,
        Scale::NONE,
        &mut recorder(&mut log),
    )
    .unwrap();
    let out = fused_allgather::<Host, _, f32>(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[],
        &[],
        &[],
        &mut recorder(&mut log),
    )
    .unwrap();
    assert!(out.is_empty());
    assert!(log.is_empty());
}

#[test]
fn wrong_lengths_are_errors_that_name_the_tensor() {
    let mut comm = Loopback::default();
    let mut bufs = FusionBuffers::new();
    let mut ignore = |_: Phase, _: Edge| {};
    let err = fused_allgather(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&[1u8][..], &[2, 3]],
        &[1, 1],
        &[1, 3],
        &mut ignore,
    )
    .unwrap_err();
    assert_eq!(
        err,
        FusionError::TensorLength {
            op: "allgather input",
            tensor: 1,
            expected: 3,
            actual: 2
        }
    );
    let err = fused_allgather(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&[1u8][..]],
        &[1],
        &[1, 1],
        &mut ignore,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "allgather: first_dims has 2 entries, expected 1"
    );
    let err = fused_allgather(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&[1u8][..]],
        &[usize::MAX],
        &[2],
        &mut ignore,
    )
    .unwrap_err();
    assert_eq!(
        err,
        FusionError::Overflow {
            op: "allgather",
            tensor: 0
        }
    );

    let mut out = [0u8; 1];
    let err = fused_reduce_scatter(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&[1u8, 2][..]],
        &mut [&mut out[..]],
        &[vec![2]],
        ReduceOp::Sum,
        Scale::NONE,
        &mut ignore,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "reduce-scatter output: tensor 0 has 1 elements, expected 2"
    );
    let err = fused_reduce_scatter(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&[1u8][..]],
        &mut [&mut out[..]],
        &[vec![1, 0]],
        ReduceOp::Sum,
        Scale::NONE,
        &mut ignore,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "reduce-scatter: counts[0] has 2 entries, expected 1"
    );
}

#[test]
fn short_allocations_fail_every_fused_operation_before_it_copies() {
    let mut comm = ShortAllocator(Loopback::default());
    let mut bufs = FusionBuffers::new();
    let mut ignore = |_: Phase, _: Edge| {};
    let (mut a, mut b) = ([1i16, 2], [3i16]);
    let err = fused_allreduce(
        &mut comm,
        &mut bufs,
        Device::Cuda(0),
        &mut [&mut a[..], &mut b[..]],
        ReduceOp::Sum,
        Scale::NONE,
        &mut ignore,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the fusion buffer of i16 on cuda:0: 3 elements were asked for, but the memory allocated 2"
    );
    assert_eq!((a, b), ([1, 2], [3]), "the tensors are untouched");

    let err = fused_allgather(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&a[..], &b[..]],
        &[1, 1],
        &[2, 1],
        &mut ignore,
    )
    .unwrap_err();
    assert!(
        matches!(&err, FusionError::ShortAllocation { what, requested: 2, allocated: 1, .. } if what == "allgather output 0"),
        "{err}"
    );

    let mut out = ([0i16; 2], [0i16; 1]);
    let err = fused_reduce_scatter(
        &mut comm,
        &mut bufs,
        Device::Cpu,
        &[&a[..], &b[..]],
        &mut [&mut out.0[..], &mut out.1[..]],
        &[vec![2], vec![1]],
        ReduceOp::Sum,
        Scale::NONE,
        &mut ignore,
    )
    .unwrap_err();
    assert!(
        matches!(&err, FusionError::ShortAllocation { what, requested: 6, allocated: 5, .. } if what == "the fusion buffer"),
        "{err}"
    );
    assert_eq!(out, ([0; 2], [0]), "the outputs are untouched");
    assert_eq!(bufs.bytes_allocated(), 0, "no short buffer is kept");
}

#[test]
fn transport_errors_pass_through() {
    let mut comm = Loopback::default();
    let err = comm.recv(&mut [0u8; 1], 3, 0).unwrap_err();
    assert_eq!(FusionError::from(err.clone()), FusionError::Transport(err));
}
