//! CONTRACT (to be implemented): serde + postcard behind a header
//! (magic + format version). Never panics on arbitrary input.
use crate::message::{RequestList, ResponseList};
use bytes::Bytes;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("placeholder")]
    Placeholder,
}

pub fn encode_request_list(_list: &RequestList) -> Bytes {
    unimplemented!("protocol helper")
}
pub fn decode_request_list(_bytes: &[u8]) -> Result<RequestList, CodecError> {
    unimplemented!("protocol helper")
}
pub fn encode_response_list(_list: &ResponseList) -> Bytes {
    unimplemented!("protocol helper")
}
pub fn decode_response_list(_bytes: &[u8]) -> Result<ResponseList, CodecError> {
    unimplemented!("protocol helper")
}
