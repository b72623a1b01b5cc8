//! kolo facade (engine work owns this crate).
