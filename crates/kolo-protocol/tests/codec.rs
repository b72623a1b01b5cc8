//! The wire codec: round trips, the header, and every decode error.

mod common;

use common::{request_list, request_lists_identical, response_list, response_lists_identical};
use kolo_protocol::{
    decode_request_list, decode_response_list, encode_request_list, encode_response_list,
    CodecError, DataType, Device, MessageKind, ReduceOp, Request, RequestKind, RequestList,
    Response, ResponseList, FORMAT_VERSION, HEADER_LEN, MAGIC,
};
use proptest::prelude::*;

fn sample_requests() -> RequestList {
    RequestList {
        requests: vec![
            Request::new(
                0,
                "grad/w",
                RequestKind::Allreduce,
                DataType::F32,
                vec![2, 3],
            ),
            Request {
                device: Device::Cuda(3),
                root_rank: 1,
                reduce_op: ReduceOp::Max,
                prescale: 0.5,
                postscale: f64::NAN,
                splits: vec![1, 2],
                ..Request::new(0, "émbed/ü", RequestKind::Alltoall, DataType::BF16, vec![3])
            },
        ],
        shutdown: true,
    }
}

fn sample_responses() -> ResponseList {
    let mut op = Response::error("grad/w", "");
    op.kind = kolo_protocol::ResponseKind::Op(RequestKind::Allgather);
    op.first_dims = vec![4, 0, 7];
    op.devices = vec![Device::Cpu, Device::Cuda(1)];
    ResponseList {
        responses: vec![op, Response::error("x", "Mismatched ...")],
        shutdown: false,
    }
}

#[test]
fn request_list_round_trips_including_nan() {
    let list = sample_requests();
    let decoded = decode_request_list(&encode_request_list(&list)).unwrap();
    assert!(request_lists_identical(&decoded, &list), "{decoded:?}");
    let empty = RequestList::default();
    assert_eq!(
        decode_request_list(&encode_request_list(&empty)).unwrap(),
        empty
    );
}

#[test]
fn response_list_round_trips() {
    let list = sample_responses();
    assert_eq!(
        decode_response_list(&encode_response_list(&list)).unwrap(),
        list
    );
}

#[test]
fn header_is_magic_version_kind() {
    let bytes = encode_request_list(&RequestList::default());
    assert_eq!(&bytes[..4], b"KOLO");
    assert_eq!(bytes[..4], MAGIC);
    assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), FORMAT_VERSION);
    assert_eq!(bytes[6], MessageKind::RequestList as u8);
    // Empty list, shutdown false: two zero bytes of body.
    assert_eq!(&bytes[HEADER_LEN..], &[0, 0]);
    let bytes = encode_response_list(&ResponseList::default());
    assert_eq!(bytes[6], MessageKind::ResponseList as u8);
    assert_eq!(MessageKind::from_byte(2), Some(MessageKind::ResponseList));
    assert_eq!(MessageKind::from_byte(0), None);
}

#[test]
fn bad_magic_is_reported_with_the_bytes_found() {
    let mut bytes = encode_request_list(&sample_requests()).to_vec();
    bytes[..4].copy_from_slice(b"HVD!");
    let err = decode_request_list(&bytes).unwrap_err();
    assert_eq!(err, CodecError::BadMagic { found: *b"HVD!" });
    assert!(err.to_string().contains("bad magic"));
}

#[test]
fn unsupported_version_names_both_versions() {
    let mut bytes = encode_response_list(&sample_responses()).to_vec();
    bytes[4..6].copy_from_slice(&7u16.to_le_bytes());
    let err = decode_response_list(&bytes).unwrap_err();
    assert_eq!(
        err,
        CodecError::UnsupportedVersion {
            found: 7,
            supported: FORMAT_VERSION
        }
    );
    let text = err.to_string();
    assert!(
        text.contains('7') && text.contains(&FORMAT_VERSION.to_string()),
        "{text}"
    );
}

#[test]
fn wrong_kind_is_rejected_both_ways() {
    let requests = encode_request_list(&sample_requests());
    let responses = encode_response_list(&sample_responses());
    assert_eq!(
        decode_response_list(&requests).unwrap_err(),
        CodecError::WrongKind {
            expected: MessageKind::ResponseList,
            found: 1
        }
    );
    assert_eq!(
        decode_request_list(&responses).unwrap_err(),
        CodecError::WrongKind {
            expected: MessageKind::RequestList,
            found: 2
        }
    );
    let mut unknown = requests.to_vec();
    unknown[6] = 0xEE;
    let err = decode_request_list(&unknown).unwrap_err();
    assert!(err.to_string().contains("238"), "{err}");
}

#[test]
fn every_strict_prefix_is_truncated() {
    let bytes = encode_request_list(&sample_requests());
    for len in 0..bytes.len() {
        let err = decode_request_list(&bytes[..len]).unwrap_err();
        if len < HEADER_LEN {
            assert_eq!(err, CodecError::TruncatedHeader { len });
        } else {
            assert_eq!(err, CodecError::TruncatedBody, "prefix of {len} bytes");
        }
    }
    let bytes = encode_response_list(&sample_responses());
    for len in HEADER_LEN..bytes.len() {
        assert_eq!(
            decode_response_list(&bytes[..len]).unwrap_err(),
            CodecError::TruncatedBody
        );
    }
}

#[test]
fn trailing_bytes_are_counted() {
    let mut bytes = encode_request_list(&sample_requests()).to_vec();
    bytes.extend_from_slice(&[0, 1, 2]);
    assert_eq!(
        decode_request_list(&bytes).unwrap_err(),
        CodecError::TrailingBytes { count: 3 }
    );
}

#[test]
fn malformed_body_carries_postcards_reason() {
    let header = |kind: MessageKind| {
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        h.push(kind as u8);
        h
    };
    // An empty request list whose shutdown flag is 2: not a bool.
    let mut bad_bool = header(MessageKind::RequestList);
    bad_bool.extend_from_slice(&[0, 2]);
    // One request whose name is invalid UTF-8.
    let mut bad_utf8 = header(MessageKind::RequestList);
    bad_utf8.extend_from_slice(&[1, 0, 2, 0xC3, 0x28]);
    // One request with kind variant 99.
    let mut bad_variant = header(MessageKind::RequestList);
    bad_variant.extend_from_slice(&[1, 0, 0, 99]);
    // A varint rank of six continuation bytes.
    let mut bad_varint = header(MessageKind::RequestList);
    bad_varint.extend_from_slice(&[1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]);
    for (bytes, reason) in [
        (bad_bool, postcard::Error::DeserializeBadBool),
        (bad_utf8, postcard::Error::DeserializeBadUtf8),
        (bad_variant, postcard::Error::SerdeDeCustom),
        (bad_varint, postcard::Error::DeserializeBadVarint),
    ] {
        let err = decode_request_list(&bytes).unwrap_err();
        assert_eq!(
            err,
            CodecError::Malformed {
                reason: reason.clone()
            }
        );
        assert!(err.to_string().contains(&reason.to_string()), "{err}");
        assert!(std::error::Error::source(&err).is_some());
    }
}

#[test]
fn huge_length_prefixes_are_errors() {
    let mut header = MAGIC.to_vec();
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.push(MessageKind::RequestList as u8);
    // 2^60 as a postcard varint: nine 7-bit groups.
    let huge = {
        let mut v = Vec::new();
        let mut n = 1u64 << 60;
        while n >= 0x80 {
            v.push((n as u8) | 0x80);
            n >>= 7;
        }
        v.push(n as u8);
        v
    };
    // 2^60 requests.
    let mut requests = header.clone();
    requests.extend_from_slice(&huge);
    // One request whose name claims 2^60 bytes.
    let mut name = header.clone();
    name.extend_from_slice(&[1, 0]);
    name.extend_from_slice(&huge);
    // One request whose shape claims 2^60 dimensions.
    let mut shape = header.clone();
    shape.extend_from_slice(&[1, 0, 1, b'x', 0, 0]);
    shape.extend_from_slice(&huge);
    for bytes in [requests, name, shape] {
        assert_eq!(
            decode_request_list(&bytes).unwrap_err(),
            CodecError::TruncatedBody
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_request_lists_round_trip(list in request_list()) {
        let decoded = decode_request_list(&encode_request_list(&list)).unwrap();
        prop_assert!(request_lists_identical(&decoded, &list));
    }

    #[test]
    fn arbitrary_response_lists_round_trip(list in response_list()) {
        let decoded = decode_response_list(&encode_response_list(&list)).unwrap();
        prop_assert!(response_lists_identical(&decoded, &list));
    }

    #[test]
    fn corrupted_messages_decode_to_a_value_or_an_error(
        list in request_list(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = encode_request_list(&list).to_vec();
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        let len = cut.index(bytes.len() + 1);
        check_total(&bytes[..len]);
    }
}

/// Decodes `bytes` both ways; whatever decodes must re-encode to something
/// no longer than the input that decodes to the same value.
fn check_total(bytes: &[u8]) {
    if let Ok(list) = decode_request_list(bytes) {
        let again = encode_request_list(&list);
        assert!(again.len() <= bytes.len());
        assert!(request_lists_identical(
            &decode_request_list(&again).unwrap(),
            &list
        ));
    }
    if let Ok(list) = decode_response_list(bytes) {
        let again = encode_response_list(&list);
        assert!(again.len() <= bytes.len());
        assert!(response_lists_identical(
            &decode_response_list(&again).unwrap(),
            &list
        ));
    }
}

fn valid_header(kind: u8) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.push(kind);
    h
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_total(&bytes);
        prop_assert!(decode_request_list(&bytes).is_err() || bytes.starts_with(&MAGIC));
    }

    #[test]
    fn arbitrary_bodies_behind_a_valid_header_never_panic(
        kind in 1u8..=2,
        body in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut bytes = valid_header(kind);
        bytes.extend_from_slice(&body);
        check_total(&bytes);
    }
}
