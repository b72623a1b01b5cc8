//! kolo-timeline (timeline work owns this crate).
