//! kolo-protocol: the vocabulary every kolo crate speaks.
//!
//! (Crate docs with a runnable example: owned by the protocol work.)

pub mod codec;
pub mod message;
pub mod types;
pub mod validate;

pub use codec::{decode_request_list, decode_response_list, encode_request_list, encode_response_list, CodecError};
pub use message::{Request, RequestList, Response, ResponseKind, ResponseList};
pub use types::{DataType, Device, ReduceOp, RequestKind};
pub use validate::validate;
