//! The coordinator's wire codec on arbitrary bytes: decoding never panics,
//! and whatever decodes encodes back to bytes that decode and encode to
//! the same bytes (bytes, not values: a NaN scale is not equal to itself).
#![no_main]

use kolo_protocol::codec::{
    decode_request_list, decode_response_list, encode_request_list, encode_response_list,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(list) = decode_request_list(data) {
        let bytes = encode_request_list(&list);
        let again = decode_request_list(&bytes).expect("re-encoded requests decode");
        assert_eq!(encode_request_list(&again), bytes);
    }
    if let Ok(list) = decode_response_list(data) {
        let bytes = encode_response_list(&list);
        let again = decode_response_list(&bytes).expect("re-encoded responses decode");
        assert_eq!(encode_response_list(&again), bytes);
    }
});
