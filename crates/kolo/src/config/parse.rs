//! Parsing of configuration values: pure functions from the text of a
//! variable to its value, or to a reason naming what is expected.

use std::time::Duration;

/// A byte count: digits with an optional binary suffix `K`, `M` or `G`
/// (1024-based, case-insensitive, optionally followed by `B` or `iB`), or a
/// plain `B`: `134217728`, `128M`, `64MiB`, `1g`, `0`.
pub fn bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err("expected a byte count such as 134217728, 64M or 1G".into());
    }
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("unknown size suffix {other:?} (use K, M or G)")),
    };
    let value: usize = digits
        .parse()
        .map_err(|_| format!("{digits} does not fit in a byte count"))?;
    value
        .checked_mul(1usize << shift)
        .ok_or_else(|| format!("{text} bytes do not fit in a byte count"))
}

/// A non-negative, finite number (fractions allowed).
fn non_negative(text: &str, unit: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("expected a number of {unit}"))?;
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(format!("expected a finite, non-negative number of {unit}"))
    }
}

/// Milliseconds, fractions allowed: `1`, `0.5`, `2.5`.
pub fn millis(text: &str) -> Result<Duration, String> {
    let ms = non_negative(text, "milliseconds")?;
    Duration::try_from_secs_f64(ms / 1000.0).map_err(|e| format!("{ms} ms: {e}"))
}

/// Seconds, fractions allowed; 0 means "never" (`None`).
pub fn seconds_or_never(text: &str) -> Result<Option<Duration>, String> {
    let secs = non_negative(text, "seconds")?;
    if secs == 0.0 {
        return Ok(None);
    }
    Duration::try_from_secs_f64(secs)
        .map(Some)
        .map_err(|e| format!("{secs} s: {e}"))
}

/// A count of things: a non-negative integer.
pub fn count(text: &str) -> Result<usize, String> {
    text.trim()
        .parse()
        .map_err(|_| "expected a non-negative integer".into())
}

/// A switch: `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`
/// (case-insensitive).
pub fn switch(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected 1 or 0 (or true/false, yes/no, on/off)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn byte_counts() {
        assert_eq!(bytes("0"), Ok(0));
        assert_eq!(bytes("134217728"), Ok(128 << 20));
        assert_eq!(bytes("128M"), Ok(128 << 20));
        assert_eq!(bytes("64mib"), Ok(64 << 20));
        assert_eq!(bytes("4 K"), Ok(4096));
        assert_eq!(bytes("1G"), Ok(1 << 30));
        assert_eq!(bytes("12B"), Ok(12));
        assert!(bytes("").is_err());
        assert!(bytes("M").is_err());
        assert!(bytes("-1").is_err());
        assert!(bytes("1.5M").is_err());
        assert!(bytes("3T").is_err());
        assert!(bytes("99999999999999999999G").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(millis("1"), Ok(Duration::from_millis(1)));
        assert_eq!(millis("0.5"), Ok(Duration::from_micros(500)));
        assert!(millis("-1").is_err());
        assert!(millis("inf").is_err());
        assert!(millis("fast").is_err());
        assert_eq!(seconds_or_never("0"), Ok(None));
        assert_eq!(seconds_or_never("60"), Ok(Some(Duration::from_secs(60))));
        assert_eq!(
            seconds_or_never("0.25"),
            Ok(Some(Duration::from_millis(250)))
        );
        assert!(seconds_or_never("NaN").is_err());
    }

    #[test]
    fn switches_and_counts() {
        assert_eq!(switch("1"), Ok(true));
        assert_eq!(switch("Off"), Ok(false));
        assert!(switch("2").is_err());
        assert_eq!(count("1024"), Ok(1024));
        assert!(count("-3").is_err());
    }

    proptest! {
        #[test]
        fn suffixes_multiply(n in 0usize..1 << 20, suffix in 0usize..4) {
            let (text, shift) = [("", 0), ("K", 10), ("M", 20), ("G", 30)][suffix];
            prop_assert_eq!(bytes(&format!("{n}{text}")), Ok(n << shift));
        }

        #[test]
        fn never_panics(text in ".{0,24}") {
            let _ = bytes(&text);
            let _ = millis(&text);
            let _ = seconds_or_never(&text);
            let _ = count(&text);
            let _ = switch(&text);
        }

        #[test]
        fn millis_roundtrip(us in 0u64..10_000_000) {
            let text = format!("{}", us as f64 / 1000.0);
            let parsed = millis(&text).map(|d| d.as_micros() as i128);
            prop_assert!(parsed.is_ok_and(|p| (p - i128::from(us)).abs() <= 1));
        }
    }
}
