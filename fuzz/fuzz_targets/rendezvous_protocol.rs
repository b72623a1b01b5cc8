//! The rendezvous store's side of a connection on arbitrary bytes, as its
//! server reads them: the hello frame (bounded, checked), then request
//! frames (bounded lengths, postcard bodies, bounds on keys, values and
//! counts) applied to a store. Nothing panics or allocates past a frame's
//! bound, and the store keeps its bounds.
#![no_main]

use kolo_rendezvous::store::Store;
use kolo_rendezvous::wire::{
    decode, read_frame, request_problem, Hello, Request, MAGIC, MAX_FRAME_BYTES, MAX_VALUE_BYTES,
};
use libfuzzer_sys::fuzz_target;
use std::io::Cursor;

/// The hello's bound (the server's).
const MAX_HELLO_BYTES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let mut stream = Cursor::new(data);
    let Ok(body) = read_frame(&mut stream, MAX_HELLO_BYTES) else {
        return;
    };
    assert!(body.len() <= MAX_HELLO_BYTES);
    let Ok(hello) = decode::<Hello>(&body) else {
        return;
    };
    let _ = hello.magic == MAGIC;
    let mut store = Store::default();
    // A connection's requests, until the bytes end or break the protocol.
    for _ in 0..64 {
        let Ok(body) = read_frame(&mut stream, MAX_FRAME_BYTES) else {
            return;
        };
        assert!(body.len() <= MAX_FRAME_BYTES);
        let Ok(request) = decode::<Request>(&body) else {
            return;
        };
        if request_problem(&request).is_some() {
            continue;
        }
        let _ = store.apply(&request);
        for key in ["a", "b", "key"] {
            if let Some(value) = store.get(key) {
                assert!(value.len() <= MAX_VALUE_BYTES);
            }
        }
    }
});
