//! kolo-threads (threads work owns this crate).
