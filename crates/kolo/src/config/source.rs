//! Reading a variable's raw value (an `OsString`, as the environment holds
//! it): a path keeps its bytes; any other value must be UTF-8 text, and one
//! that is not is an error naming the variable, never taken for unset.

use crate::error::Error;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// True when `value` counts as unset: empty or only whitespace.
fn blank(value: &OsStr) -> bool {
    value.to_str().is_some_and(|text| text.trim().is_empty())
}

/// The text of `variable`'s `value`: `None` when unset or blank, an
/// [`Error::Config`] naming the variable when it is not UTF-8.
pub fn text(variable: &str, value: Option<OsString>) -> Result<Option<String>, Error> {
    let Some(value) = value.filter(|v| !blank(v)) else {
        return Ok(None);
    };
    match value.into_string() {
        Ok(text) => Ok(Some(text)),
        Err(raw) => Err(Error::Config {
            variable: variable.to_owned(),
            value: raw.to_string_lossy().into_owned(),
            reason: not_utf8(&raw),
        }),
    }
}

/// A path `value`, its bytes as given: `None` when unset or blank.
pub fn path(value: Option<OsString>) -> Option<PathBuf> {
    value.filter(|v| !blank(v)).map(PathBuf::from)
}

/// Why `raw` is not text: the first byte that is not UTF-8 and where.
fn not_utf8(raw: &OsStr) -> String {
    let bytes = raw.as_encoded_bytes();
    let (at, len) = match std::str::from_utf8(bytes) {
        Err(e) => (
            e.valid_up_to(),
            e.error_len().unwrap_or(bytes.len() - e.valid_up_to()),
        ),
        Ok(_) => (0, 0),
    };
    let bad: Vec<String> = bytes
        .get(at..at + len)
        .unwrap_or_default()
        .iter()
        .map(|b| format!("0x{b:02x}"))
        .collect();
    format!(
        "not valid UTF-8 ({} at byte {at}); only a path (KOLO_TIMELINE) may hold other bytes",
        bad.join(" ")
    )
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};

    fn raw(bytes: &[u8]) -> Option<OsString> {
        Some(OsString::from_vec(bytes.to_vec()))
    }

    #[test]
    fn text_is_text_and_blank_is_unset() {
        assert_eq!(text("V", None), Ok(None));
        assert_eq!(text("V", raw(b"")), Ok(None));
        assert_eq!(text("V", raw(b" \t")), Ok(None));
        assert_eq!(text("V", raw(b" 64M")), Ok(Some(" 64M".into())));
        assert_eq!(
            text("V", raw("\u{e9}t\u{e9}".as_bytes())),
            Ok(Some("\u{e9}t\u{e9}".into()))
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_name_the_variable_and_the_byte() {
        match text("KOLO_FUSION_THRESHOLD", raw(b"12\xffM")) {
            Err(Error::Config {
                variable,
                value,
                reason,
            }) => {
                assert_eq!(variable, "KOLO_FUSION_THRESHOLD");
                assert_eq!(value, "12\u{fffd}M");
                assert!(reason.contains("0xff at byte 2"), "{reason}");
            }
            other => panic!("expected a config error, got {other:?}"),
        }
        // A truncated sequence at the end: every byte of it is named.
        let Err(Error::Config { reason, .. }) = text("V", raw(b"ab\xe2\x82")) else {
            panic!("a truncated sequence is not text");
        };
        assert!(reason.contains("0xe2 0x82 at byte 2"), "{reason}");
    }

    #[test]
    fn a_path_keeps_its_bytes() {
        let bytes = b"/tmp/kolo-\xff\xfe.json";
        let path = path(raw(bytes)).unwrap_or_default();
        assert_eq!(path.as_os_str().as_bytes(), bytes);
        assert_eq!(super::path(raw(b"  ")), None);
        assert_eq!(super::path(None), None);
        // Surrounding spaces are part of a path.
        assert_eq!(
            super::path(raw(b" a "))
                .unwrap_or_default()
                .as_os_str()
                .as_bytes(),
            b" a "
        );
    }
}
