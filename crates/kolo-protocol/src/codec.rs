//! The wire codec: a [`RequestList`] or [`ResponseList`] as serde + postcard
//! bytes behind a seven-byte header.
//!
//! ```text
//! offset  size  field
//! 0       4     magic, b"KOLO"
//! 4       2     format version, little-endian (FORMAT_VERSION)
//! 6       1     message kind (MessageKind as u8)
//! 7       ..    postcard body; nothing may follow it
//! ```
//!
//! Encoding cannot fail. Decoding is total: any byte string yields the list
//! or a [`CodecError`], never a panic, and memory stays proportional to the
//! input actually consumed: a length prefix never drives a preallocation.

use crate::message::{RequestList, ResponseList};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt;

/// The first four bytes of every kolo message.
pub const MAGIC: [u8; 4] = *b"KOLO";

/// The body format this build writes and the only one it reads. Bump it with
/// any change to the serialized types (postcard is not self-describing).
pub const FORMAT_VERSION: u16 = 2;

/// Length of the header: magic, format version and message kind.
pub const HEADER_LEN: usize = 7;

/// Which list a message carries (byte 6 of the header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageKind {
    /// A [`RequestList`], rank to coordinator.
    RequestList = 1,
    /// A [`ResponseList`], coordinator to every rank.
    ResponseList = 2,
}

impl MessageKind {
    /// The kind for a header byte, if it names one.
    pub const fn from_byte(byte: u8) -> Option<MessageKind> {
        match byte {
            1 => Some(MessageKind::RequestList),
            2 => Some(MessageKind::ResponseList),
            _ => None,
        }
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageKind::RequestList => f.write_str("request list (kind 1)"),
            MessageKind::ResponseList => f.write_str("response list (kind 2)"),
        }
    }
}

/// Why a byte string is not a message of the expected kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Fewer bytes than the header needs.
    #[error("truncated message: {len} bytes, but the header alone is {HEADER_LEN} bytes")]
    TruncatedHeader {
        /// Length of the whole input.
        len: usize,
    },
    /// The first four bytes are not [`MAGIC`].
    #[error("bad magic {found:02x?}: expected {MAGIC:02x?} (b\"KOLO\")")]
    BadMagic {
        /// The first four bytes of the input.
        found: [u8; 4],
    },
    /// The header names a format version this build cannot read.
    #[error("unsupported format version {found}: this build reads version {supported}")]
    UnsupportedVersion {
        /// The version in the header.
        found: u16,
        /// [`FORMAT_VERSION`].
        supported: u16,
    },
    /// The header names another kind of message (or no known kind).
    #[error("wrong message kind byte {found}: expected a {expected}")]
    WrongKind {
        /// What the caller asked to decode.
        expected: MessageKind,
        /// The kind byte in the header.
        found: u8,
    },
    /// The body ends before the message does.
    #[error("truncated message body: the input ended inside the message")]
    TruncatedBody,
    /// The body is not a valid encoding of the expected list.
    #[error("malformed message body: {reason}")]
    Malformed {
        /// postcard's reason.
        #[source]
        reason: postcard::Error,
    },
    /// Bytes follow a complete message body.
    #[error("{count} trailing bytes after the message body")]
    TrailingBytes {
        /// How many bytes follow the body.
        count: usize,
    },
}

/// Encodes the list one rank sends to the coordinator.
pub fn encode_request_list(list: &RequestList) -> Bytes {
    encode(MessageKind::RequestList, list)
}

/// Decodes a message produced by [`encode_request_list`].
pub fn decode_request_list(bytes: &[u8]) -> Result<RequestList, CodecError> {
    decode(MessageKind::RequestList, bytes)
}

/// Encodes the list the coordinator broadcasts to every rank.
pub fn encode_response_list(list: &ResponseList) -> Bytes {
    encode(MessageKind::ResponseList, list)
}

/// Decodes a message produced by [`encode_response_list`].
pub fn decode_response_list(bytes: &[u8]) -> Result<ResponseList, CodecError> {
    decode(MessageKind::ResponseList, bytes)
}

fn encode<T: Serialize>(kind: MessageKind, value: &T) -> Bytes {
    let mut out = Vec::with_capacity(HEADER_LEN + 64);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.push(kind as u8);
    // postcard's serializer fails only for a full fixed-size buffer, a
    // sequence of unknown length, a map, or a custom error raised by a
    // hand-written `Serialize`. A growing Vec never fills, every sequence in
    // the lists is a `Vec`/`String` of known length, and every type derives
    // `Serialize`; so this cannot fail, for any value of the lists.
    let out = postcard::to_extend(value, out)
        .expect("postcard serialization of derived types into a Vec is infallible");
    Bytes::from(out)
}

/// Checks magic and version; returns the kind byte.
fn check_header(bytes: &[u8]) -> Result<u8, CodecError> {
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Err(CodecError::TruncatedHeader { len: bytes.len() });
    };
    let found = [header[0], header[1], header[2], header[3]];
    if found != MAGIC {
        return Err(CodecError::BadMagic { found });
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != FORMAT_VERSION {
        return Err(CodecError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    Ok(header[6])
}

fn decode<T: DeserializeOwned>(expected: MessageKind, bytes: &[u8]) -> Result<T, CodecError> {
    let found = check_header(bytes)?;
    if found != expected as u8 {
        return Err(CodecError::WrongKind { expected, found });
    }
    let body = &bytes[HEADER_LEN..];
    let mut deserializer = postcard::Deserializer::from_flavor(GuardedSlice::new(body));
    let value = T::deserialize(&mut deserializer).map_err(body_error)?;
    let rest = deserializer.finalize().map_err(body_error)?;
    if !rest.is_empty() {
        return Err(CodecError::TrailingBytes { count: rest.len() });
    }
    Ok(value)
}

fn body_error(reason: postcard::Error) -> CodecError {
    match reason {
        postcard::Error::DeserializeUnexpectedEnd => CodecError::TruncatedBody,
        reason => CodecError::Malformed { reason },
    }
}

/// A postcard input flavor over a slice that never lets a length prefix
/// drive a preallocation.
///
/// postcard hands serde a sequence's length prefix as its size hint whenever
/// the prefix does not exceed the bytes left, and serde then reserves up to
/// 1 MiB per sequence before a single element is decoded: a few kilobytes
/// claiming thousands of `Request`s would reserve a megabyte. Reporting no
/// remaining bytes makes postcard withhold the hint, so every `Vec` grows
/// from elements actually decoded (each consumes at least one input byte),
/// and strings are copied only after their bytes were found in the input.
/// Control messages are small; the cost is a few reallocations.
struct GuardedSlice<'de> {
    remaining: &'de [u8],
}

impl<'de> GuardedSlice<'de> {
    /// A flavor reading `input` from its start.
    fn new(input: &'de [u8]) -> Self {
        GuardedSlice { remaining: input }
    }
}

impl<'de> postcard::de_flavors::Flavor<'de> for GuardedSlice<'de> {
    type Remainder = &'de [u8];
    type Source = &'de [u8];

    fn pop(&mut self) -> postcard::Result<u8> {
        let (&first, rest) = self
            .remaining
            .split_first()
            .ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        self.remaining = rest;
        Ok(first)
    }

    fn size_hint(&self) -> Option<usize> {
        // Deliberately zero, see the type's documentation.
        Some(0)
    }

    fn try_take_n(&mut self, ct: usize) -> postcard::Result<&'de [u8]> {
        if ct > self.remaining.len() {
            return Err(postcard::Error::DeserializeUnexpectedEnd);
        }
        let (taken, rest) = self.remaining.split_at(ct);
        self.remaining = rest;
        Ok(taken)
    }

    fn finalize(self) -> postcard::Result<&'de [u8]> {
        Ok(self.remaining)
    }
}
