//! The store's protocol: length-prefixed frames (a little-endian `u32`
//! length, then that many bytes of a postcard-encoded message). A client
//! opens with a [`Hello`]; every later frame is a [`Request`], answered
//! by one [`Reply`]. Pure functions over bytes, with every length and
//! count bounded, so that the server can refuse a peer that speaks
//! another protocol or announces an oversized frame without reading it.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::time::Duration;

/// The first bytes of every hello: "kolo" (a peer speaking HTTP, TLS or
/// anything else is refused at once).
pub const MAGIC: u32 = u32::from_le_bytes(*b"kolo");
/// The protocol version this crate speaks.
pub const VERSION: u16 = 1;
/// The longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// The longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 16 << 20;
/// The most keys one wait names.
pub const MAX_WAIT_KEYS: usize = 1 << 16;
/// The longest frame: a value and its key with room for the framing, or
/// a wait's keys.
pub const MAX_FRAME_BYTES: usize = MAX_VALUE_BYTES + MAX_KEY_BYTES + 64;
/// The longest wait or get a client may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A client's first message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`MAGIC`].
    pub magic: u32,
    /// [`VERSION`].
    pub version: u16,
    /// The job's token (`KOLO_RENDEZVOUS_TOKEN`), if the client has one.
    pub token: Option<String>,
}

/// What a client asks of the store (the fields say what their names say).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Sets `key` to `value`, waking every waiter on it.
    Set { key: String, value: Vec<u8> },
    /// The value of `key`, once it exists (waiting at most `timeout_ms`).
    Get { key: String, timeout_ms: u64 },
    /// Returns once every key exists (waiting at most `timeout_ms`).
    Wait { keys: Vec<String>, timeout_ms: u64 },
    /// Adds `delta` to the number stored at `key` (0 if absent) and
    /// returns the sum.
    Add { key: String, delta: i64 },
    /// Sets `key` to `desired` if its value is `expected` (`None`: if it is
    /// absent); returns the value it holds afterwards.
    CompareSet {
        key: String,
        expected: Option<Vec<u8>>,
        desired: Vec<u8>,
    },
    /// Removes `key`; whether it existed.
    Delete { key: String },
}

/// The store's answer to one message (the fields say what their names
/// say).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Done (a set, a wait, an accepted hello).
    Done,
    /// A value (a get, a compare-and-set).
    Value(Vec<u8>),
    /// A number (an add).
    Number(i64),
    /// Whether the key existed (a delete).
    Existed(bool),
    /// The wait or get timed out, naming the keys still missing.
    TimedOut { missing: Vec<String> },
    /// Refused or failed, with why.
    Error(String),
}

/// Why a frame could not be read.
#[allow(missing_docs)]
#[derive(Debug)]
pub enum FrameError {
    /// The connection failed or ended.
    Io(std::io::Error),
    /// The peer announced a frame longer than the bound.
    TooLong { announced: usize, bound: usize },
    /// The bytes are not a message of this protocol.
    Malformed(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "{e}"),
            FrameError::TooLong { announced, bound } => write!(
                f,
                "a frame of {announced} bytes was announced, more than the {bound} this protocol allows"
            ),
            FrameError::Malformed(why) => write!(f, "not a message of kolo's rendezvous protocol: {why}"),
        }
    }
}

/// Encodes `message` as one frame.
pub fn encode<M: Serialize>(message: &M) -> Vec<u8> {
    let body = postcard::to_allocvec(message).unwrap_or_default();
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Decodes a frame's body.
pub fn decode<'a, M: Deserialize<'a>>(body: &'a [u8]) -> Result<M, FrameError> {
    postcard::from_bytes(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Writes `message` as one frame.
pub fn write_message<M: Serialize>(to: &mut impl Write, message: &M) -> std::io::Result<()> {
    to.write_all(&encode(message))?;
    to.flush()
}

/// Reads one frame's body of at most `bound` bytes: the length is checked
/// before anything else is read or allocated.
pub fn read_frame(from: &mut impl Read, bound: usize) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    from.read_exact(&mut len).map_err(FrameError::Io)?;
    let announced = u32::from_le_bytes(len) as usize;
    if announced > bound {
        return Err(FrameError::TooLong { announced, bound });
    }
    let mut body = vec![0u8; announced];
    from.read_exact(&mut body).map_err(FrameError::Io)?;
    Ok(body)
}

/// What is wrong with `request` against the bounds, if anything.
pub fn request_problem(request: &Request) -> Option<String> {
    let key = |key: &str| -> Option<String> {
        if key.is_empty() {
            Some("an empty key".into())
        } else if key.len() > MAX_KEY_BYTES {
            Some(format!(
                "a key of {} bytes (at most {MAX_KEY_BYTES})",
                key.len()
            ))
        } else {
            None
        }
    };
    let value = |value: &[u8]| -> Option<String> {
        (value.len() > MAX_VALUE_BYTES).then(|| {
            format!(
                "a value of {} bytes (at most {MAX_VALUE_BYTES})",
                value.len()
            )
        })
    };
    let timeout = |ms: u64| -> Option<String> {
        (Duration::from_millis(ms) > MAX_TIMEOUT)
            .then(|| format!("a timeout of {ms} ms (at most {} s)", MAX_TIMEOUT.as_secs()))
    };
    match request {
        Request::Set { key: k, value: v } => key(k).or_else(|| value(v)),
        Request::Get { key: k, timeout_ms } => key(k).or_else(|| timeout(*timeout_ms)),
        Request::Wait { keys, timeout_ms } => {
            if keys.len() > MAX_WAIT_KEYS {
                return Some(format!(
                    "a wait for {} keys (at most {MAX_WAIT_KEYS})",
                    keys.len()
                ));
            }
            keys.iter()
                .find_map(|k| key(k))
                .or_else(|| timeout(*timeout_ms))
        }
        Request::Add { key: k, .. } | Request::Delete { key: k } => key(k),
        Request::CompareSet {
            key: k,
            expected,
            desired,
        } => key(k)
            .or_else(|| expected.as_deref().and_then(value))
            .or_else(|| value(desired)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request() -> impl Strategy<Value = Request> {
        let key = "[a-z/0-9]{1,20}";
        prop_oneof![
            (key, prop::collection::vec(any::<u8>(), 0..64))
                .prop_map(|(key, value)| Request::Set { key, value }),
            (key, any::<u64>()).prop_map(|(key, timeout_ms)| Request::Get { key, timeout_ms }),
            (prop::collection::vec(key, 0..8), any::<u64>())
                .prop_map(|(keys, timeout_ms)| Request::Wait { keys, timeout_ms }),
            (key, any::<i64>()).prop_map(|(key, delta)| Request::Add { key, delta }),
            (
                key,
                prop::option::of(prop::collection::vec(any::<u8>(), 0..16)),
                prop::collection::vec(any::<u8>(), 0..16)
            )
                .prop_map(|(key, expected, desired)| Request::CompareSet {
                    key,
                    expected,
                    desired
                }),
            key.prop_map(|key| Request::Delete { key }),
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip_through_frames(request in request()) {
            let frame = encode(&request);
            let body = read_frame(&mut frame.as_slice(), MAX_FRAME_BYTES).unwrap();
            prop_assert_eq!(decode::<Request>(&body).unwrap(), request);
        }

        #[test]
        fn any_bytes_decode_to_a_message_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<Request>(&bytes);
            let _ = decode::<Hello>(&bytes);
            let _ = read_frame(&mut bytes.as_slice(), 64);
        }
    }

    #[test]
    fn an_oversized_length_is_refused_before_reading_the_body() {
        let mut frame = (u32::MAX).to_le_bytes().to_vec();
        frame.extend_from_slice(b"short");
        match read_frame(&mut frame.as_slice(), MAX_FRAME_BYTES) {
            Err(FrameError::TooLong { announced, bound }) => {
                assert_eq!(announced, u32::MAX as usize);
                assert_eq!(bound, MAX_FRAME_BYTES);
            }
            other => panic!("expected TooLong, got {other:?}"),
        }
    }

    #[test]
    fn bounds_name_what_exceeds_them() {
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let problem = request_problem(&Request::Delete { key: long }).unwrap();
        assert!(problem.contains("1025 bytes"), "{problem}");
        let empty = request_problem(&Request::Add {
            key: String::new(),
            delta: 1,
        });
        assert_eq!(empty.as_deref(), Some("an empty key"));
        let wait = request_problem(&Request::Wait {
            keys: vec!["a".into()],
            timeout_ms: u64::MAX,
        })
        .unwrap();
        assert!(wait.contains("timeout"), "{wait}");
        assert_eq!(
            request_problem(&Request::Set {
                key: "a".into(),
                value: vec![0; 16]
            }),
            None
        );
    }
}
