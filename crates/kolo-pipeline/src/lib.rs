//! kolo-pipeline (pipeline work owns this crate).
