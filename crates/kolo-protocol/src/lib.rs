//! kolo-protocol: the vocabulary every kolo crate speaks.
//!
//! A rank that wants a collective on a named tensor sends a [`Request`]
//! (operation, dtype, shape, device, root, reduce op, scale factors) in a
//! [`RequestList`] to the coordinator; once the ranks have all asked for a
//! name, the coordinator turns their requests into one [`Response`] with
//! [`validate()`] — an op to perform or an error naming the tensor, the
//! conflicting values and the ranks — and broadcasts a [`ResponseList`].
//! The [`codec`] puts both lists on the wire as serde + postcard behind a
//! small header (magic, format version, message kind); decoding any byte
//! string is total: it returns the list or a typed [`CodecError`], never
//! panics, and allocates no more than the input justifies.
//!
//! ```
//! use kolo_protocol::{
//!     decode_request_list, encode_request_list, validate, DataType, Request, RequestKind,
//!     RequestList, ResponseKind,
//! };
//!
//! // Every rank of a world of two asks to allreduce "grad/w".
//! let world_size = 2;
//! let mut received = Vec::new();
//! for rank in 0..world_size {
//!     let list = RequestList {
//!         requests: vec![Request::new(rank, "grad/w", RequestKind::Allreduce, DataType::F32, vec![2, 3])],
//!         shutdown: false,
//!     };
//!     let bytes = encode_request_list(&list);
//!     let decoded = decode_request_list(&bytes)?;
//!     assert_eq!(decoded, list);
//!     received.extend(decoded.requests);
//! }
//!
//! let response = validate(&received, world_size);
//! assert_eq!(response.kind, ResponseKind::Op(RequestKind::Allreduce));
//! assert_eq!(response.tensor_sizes, vec![6]);
//!
//! // A rank that disagrees on the shape turns the response into an error.
//! received[1].shape = vec![3, 2];
//! let response = validate(&received, world_size);
//! assert!(response.is_error());
//! assert_eq!(
//!     response.error_message,
//!     "Mismatched ALLREDUCE tensor shapes for tensor 'grad/w': rank 0 sent [2, 3], but rank 1 sent [3, 2]."
//! );
//! # Ok::<(), kolo_protocol::CodecError>(())
//! ```
#![warn(missing_docs)]

pub mod codec;
pub mod message;
pub mod params;
pub mod types;
pub mod validate;

pub use codec::{
    decode_request_list, decode_response_list, encode_request_list, encode_response_list,
    CodecError, MessageKind, FORMAT_VERSION, HEADER_LEN, MAGIC,
};
pub use message::{Request, RequestList, Response, ResponseKind, ResponseList};
pub use params::{Params, Shape};
pub use types::{Compression, DataType, Device, ReduceOp, RequestKind};
pub use validate::{try_validate, validate, ValidationError};
