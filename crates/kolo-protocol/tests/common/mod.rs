//! proptest strategies for every protocol type, and bitwise comparisons
//! (f64 fields may be NaN, which `PartialEq` never equates).
#![allow(dead_code)] // each test binary uses its own subset

use kolo_protocol::{
    DataType, Device, ReduceOp, Request, RequestKind, RequestList, Response, ResponseKind,
    ResponseList,
};
use proptest::prelude::*;

pub fn data_type() -> impl Strategy<Value = DataType> {
    prop::sample::select(DataType::ALL.to_vec())
}

pub fn reduce_op() -> impl Strategy<Value = ReduceOp> {
    prop::sample::select(ReduceOp::ALL.to_vec())
}

pub fn request_kind() -> impl Strategy<Value = RequestKind> {
    prop::sample::select(RequestKind::ALL.to_vec())
}

pub fn device() -> impl Strategy<Value = Device> {
    prop_oneof![Just(Device::Cpu), any::<u32>().prop_map(Device::Cuda)]
}

pub fn response_kind() -> impl Strategy<Value = ResponseKind> {
    prop_oneof![
        Just(ResponseKind::Error),
        request_kind().prop_map(ResponseKind::Op)
    ]
}

/// Any f64 bit pattern: NaNs with payloads, infinities, -0.0, subnormals.
pub fn any_f64() -> impl Strategy<Value = f64> {
    any::<u64>().prop_map(f64::from_bits)
}

/// Names with arbitrary Unicode (multi-byte UTF-8 on the wire).
pub fn name() -> impl Strategy<Value = String> {
    "\\PC{0,12}"
}

pub fn u64s() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(any::<u64>(), 0..5)
}

pub fn request() -> impl Strategy<Value = Request> {
    (
        any::<u32>(),
        name(),
        request_kind(),
        data_type(),
        u64s(),
        device(),
        any::<u32>(),
        reduce_op(),
        any_f64(),
        any_f64(),
        u64s(),
    )
        .prop_map(
            |(
                rank,
                tensor_name,
                kind,
                dtype,
                shape,
                device,
                root_rank,
                reduce_op,
                prescale,
                postscale,
                splits,
            )| {
                Request {
                    compression: Default::default(),
                    rank,
                    tensor_name,
                    kind,
                    dtype,
                    shape,
                    device,
                    root_rank,
                    reduce_op,
                    prescale,
                    postscale,
                    splits,
                }
            },
        )
}

pub fn request_list() -> impl Strategy<Value = RequestList> {
    (prop::collection::vec(request(), 0..6), any::<bool>())
        .prop_map(|(requests, shutdown)| RequestList { requests, shutdown })
}

pub fn response() -> impl Strategy<Value = Response> {
    (
        response_kind(),
        prop::collection::vec(name(), 0..4),
        "\\PC{0,40}",
        data_type(),
        prop::collection::vec(device(), 0..5),
        reduce_op(),
        any::<u32>(),
        any_f64(),
        any_f64(),
        u64s(),
        u64s(),
        u64s(),
    )
        .prop_map(
            |(
                kind,
                tensor_names,
                error_message,
                dtype,
                devices,
                reduce_op,
                root_rank,
                prescale,
                postscale,
                first_dims,
                splits,
                tensor_sizes,
            )| {
                Response {
                    compression: Default::default(),
                    kind,
                    tensor_names,
                    error_message,
                    dtype,
                    devices,
                    reduce_op,
                    root_rank,
                    prescale,
                    postscale,
                    first_dims,
                    splits,
                    tensor_sizes,
                }
            },
        )
}

pub fn response_list() -> impl Strategy<Value = ResponseList> {
    (prop::collection::vec(response(), 0..6), any::<bool>()).prop_map(|(responses, shutdown)| {
        ResponseList {
            responses,
            shutdown,
        }
    })
}

/// The scale factors as bits, and a copy with them zeroed so that the rest
/// compares with `PartialEq`.
fn split_request(r: &Request) -> ([u64; 2], Request) {
    let bits = [r.prescale.to_bits(), r.postscale.to_bits()];
    let rest = Request {
        prescale: 0.0,
        postscale: 0.0,
        ..r.clone()
    };
    (bits, rest)
}

fn split_response(r: &Response) -> ([u64; 2], Response) {
    let bits = [r.prescale.to_bits(), r.postscale.to_bits()];
    let rest = Response {
        prescale: 0.0,
        postscale: 0.0,
        ..r.clone()
    };
    (bits, rest)
}

/// Equality with f64 fields compared bit for bit.
pub fn request_lists_identical(a: &RequestList, b: &RequestList) -> bool {
    a.shutdown == b.shutdown
        && a.requests.len() == b.requests.len()
        && a.requests
            .iter()
            .zip(&b.requests)
            .all(|(x, y)| split_request(x) == split_request(y))
}

/// Equality with f64 fields compared bit for bit.
pub fn response_lists_identical(a: &ResponseList, b: &ResponseList) -> bool {
    a.shutdown == b.shutdown
        && a.responses.len() == b.responses.len()
        && a.responses
            .iter()
            .zip(&b.responses)
            .all(|(x, y)| split_response(x) == split_response(y))
}

/// Equality of two responses with f64 fields compared bit for bit.
pub fn responses_identical(a: &Response, b: &Response) -> bool {
    split_response(a) == split_response(b)
}
