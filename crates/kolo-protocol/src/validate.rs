//! CONTRACT (to be implemented): the pure validation function.
use crate::message::{Request, Response};

/// Validates the requests that all `world_size` ranks sent for one tensor
/// name (one request per rank expected, in any order) into the response
/// every rank performs: an op response, or an error response naming the
/// tensor, both conflicting values and the ranks that sent them.
/// Independent of the order of `requests`.
pub fn validate(_requests: &[Request], _world_size: u32) -> Response {
    unimplemented!("protocol helper")
}
