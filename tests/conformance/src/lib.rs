//! kolo-conformance (transport work owns this crate).
