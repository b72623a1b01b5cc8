//! Reading a trace file back, as a viewer does.

use serde_json::Value;

/// Parses a trace file's text into its records, accepting what the viewers
/// accept: a closed JSON array, or one left open (`[` then records each
/// followed by `,`), as [`Timeline`](crate::Timeline) writes it.
pub fn parse_trace(text: &str) -> Result<Vec<Value>, serde_json::Error> {
    let body = text.trim_end();
    let body = body.strip_suffix(']').unwrap_or(body).trim_end();
    let body = body.strip_suffix(',').unwrap_or(body);
    serde_json::from_str(&format!("{body}]"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_open_closed_and_empty_arrays() {
        assert_eq!(parse_trace("[\n").unwrap().len(), 0);
        assert_eq!(parse_trace("[\n{\"a\":1},\n{\"a\":2},\n").unwrap().len(), 2);
        assert_eq!(parse_trace("[{\"a\":[1]},{\"a\":2}]\n").unwrap().len(), 2);
        assert_eq!(parse_trace("[{\"a\":1},\n]").unwrap().len(), 1);
        assert_eq!(parse_trace("[{\"a\":[1,2]}").unwrap()[0]["a"][1], 2);
    }

    #[test]
    fn rejects_what_is_not_a_trace() {
        assert!(parse_trace("").is_err());
        assert!(parse_trace("{\"a\":1},").is_err());
        assert!(parse_trace("[{\"a\":").is_err());
    }
}
