//! The text of a panic, for the errors that report one.

/// The message of a panic's payload (a `&str` or `String`, as `panic!`
/// makes them).
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)")
}
