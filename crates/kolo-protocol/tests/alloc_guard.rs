//! Decoding never allocates more than the input justifies: a length prefix
//! (up to 2^60) must not drive a preallocation.
//!
//! This binary installs a counting global allocator and holds a single test,
//! so that no other test's allocations run concurrently; counting is
//! further limited to the thread that sets `TRACKING`.

use kolo_protocol::{
    decode_request_list, decode_response_list, CodecError, MessageKind, RequestList,
    FORMAT_VERSION, MAGIC,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // `const` initialisation: reading it never allocates, so the allocator
    // may consult it without recursing.
    static TRACKING: Cell<bool> = const { Cell::new(false) };
}

fn note(size: usize) {
    if TRACKING.with(Cell::get) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System` upholds the `GlobalAlloc` contract; the counting
// only reads a thread-local flag and updates an atomic, neither of which
// allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds the contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this `layout` (every
        // allocation above is forwarded to `System`).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds
        // `realloc`'s contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The largest single allocation `f` makes on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.store(0, Ordering::Relaxed);
    TRACKING.with(|t| t.set(true));
    let value = f();
    TRACKING.with(|t| t.set(false));
    (value, LARGEST.load(Ordering::Relaxed))
}

fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out
}

fn message(kind: MessageKind, body: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.push(kind as u8);
    out.extend_from_slice(body);
    out
}

#[test]
fn length_prefixes_never_drive_allocations() {
    let huge = varint(1 << 60);
    // A list of 2^60 requests; a request whose name, shape or splits claim
    // 2^60 entries; a response list of 2^60 responses.
    let cases = [
        message(MessageKind::RequestList, &huge),
        message(MessageKind::RequestList, &[&[1, 0][..], &huge].concat()),
        message(
            MessageKind::RequestList,
            &[&[1, 0, 1, b'x', 0, 0][..], &huge].concat(),
        ),
        message(MessageKind::ResponseList, &huge),
    ];
    for (i, bytes) in cases.iter().enumerate() {
        let ((requests, responses), largest) =
            largest_allocation(|| (decode_request_list(bytes), decode_response_list(bytes)));
        let err = if i == 3 {
            responses.unwrap_err()
        } else {
            requests.unwrap_err()
        };
        assert_eq!(err, CodecError::TruncatedBody, "case {i}");
        assert!(
            largest <= 64,
            "case {i}: allocated {largest} bytes for {} input bytes",
            bytes.len()
        );
    }

    // 4096 requests claimed, 4096 bytes follow: a prefix postcard alone would
    // trust (it does not exceed the remaining input), after which the first
    // request is malformed (an overlong varint rank).
    let mut body = varint(4096);
    body.resize(body.len() + 4096, 0xFF);
    let bytes = message(MessageKind::RequestList, &body);
    let (result, largest) = largest_allocation(|| decode_request_list(&bytes));
    assert!(
        matches!(result, Err(CodecError::Malformed { .. })),
        "{result:?}"
    );
    assert!(
        largest <= 64,
        "allocated {largest} bytes for {} input bytes",
        bytes.len()
    );

    // The same body through plain postcard reserves for all 4096 requests
    // up front: the guard above is what keeps the decoder's memory small.
    let (plain, largest) = largest_allocation(|| postcard::from_bytes::<RequestList>(&body));
    assert!(plain.is_err());
    // serde caps a reservation at 1 MiB.
    let reserved = (4096 * std::mem::size_of::<kolo_protocol::Request>()).min(1 << 20);
    assert!(largest >= reserved, "{largest} < {reserved}");
}
