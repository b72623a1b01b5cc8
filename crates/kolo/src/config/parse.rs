//! Parsing of configuration values: pure functions from the text of a
//! variable to its value, or to a reason naming what is expected.
//!
//! A well-formed value too large for its type saturates (`usize::MAX`,
//! `Duration::MAX`) instead of failing here: every caller checks the value
//! against its bound ([`super::bounds`]), whose reason names the bound, the
//! same message for `1048577` as for `99999999999999999999`.

use std::time::Duration;

/// A byte count: digits with an optional binary suffix `K`, `M` or `G`
/// (1024-based, case-insensitive, optionally followed by `B` or `iB`), or a
/// plain `B`: `134217728`, `128M`, `64MiB`, `1g`, `0`. Saturates.
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
    Ok(saturating_digits(digits).saturating_mul(1usize << shift))
}

/// The value of a non-empty run of ASCII digits, saturating.
fn saturating_digits(digits: &str) -> usize {
    digits.bytes().fold(0usize, |value, digit| {
        value
            .saturating_mul(10)
            .saturating_add(usize::from(digit - b'0'))
    })
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

/// `secs` (finite, non-negative) as a duration, saturating.
fn duration(secs: f64) -> Duration {
    // A finite, non-negative number fails only by being too large.
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// Milliseconds, fractions allowed: `1`, `0.5`, `2.5`. Saturates.
pub fn millis(text: &str) -> Result<Duration, String> {
    let ms = non_negative(text, "milliseconds")?;
    Ok(duration(ms / 1000.0))
}

/// Seconds, fractions allowed; 0 means "never" (`None`). A positive value
/// too small for a nanosecond is an error (it is not 0, and not a
/// duration either). Saturates.
pub fn seconds_or_never(text: &str) -> Result<Option<Duration>, String> {
    let secs = non_negative(text, "seconds")?;
    if secs == 0.0 {
        return Ok(None);
    }
    match duration(secs) {
        Duration::ZERO => Err(format!(
            "{secs} s is shorter than a nanosecond (0 turns it off)"
        )),
        d => Ok(Some(d)),
    }
}

/// A count of things: a non-negative integer (digits only). Saturates.
pub fn count(text: &str) -> Result<usize, String> {
    let digits = text.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("expected a non-negative integer".into());
    }
    Ok(saturating_digits(digits))
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
        assert_eq!(bytes("99999999999999999999"), Ok(usize::MAX));
        assert_eq!(bytes("99999999999999999999G"), Ok(usize::MAX));
        assert_eq!(bytes(&format!("{}G", usize::MAX >> 29)), Ok(usize::MAX));
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
        assert!(seconds_or_never("1e-12").is_err_and(|r| r.contains("nanosecond")));
        assert_eq!(seconds_or_never("1e-9"), Ok(Some(Duration::from_nanos(1))));
        assert_eq!(seconds_or_never("1e300"), Ok(Some(Duration::MAX)));
        assert_eq!(millis("1e300"), Ok(Duration::MAX));
        assert_eq!(millis("0.0000001"), Ok(Duration::ZERO));
    }

    #[test]
    fn switches_and_counts() {
        assert_eq!(switch("1"), Ok(true));
        assert_eq!(switch("Off"), Ok(false));
        assert!(switch("2").is_err());
        assert_eq!(count("1024"), Ok(1024));
        assert_eq!(count(" 7 "), Ok(7));
        assert!(count("-3").is_err());
        assert!(count("+3").is_err());
        assert!(count("").is_err());
        assert_eq!(count("18446744073709551615"), Ok(usize::MAX));
        assert_eq!(count("99999999999999999999999"), Ok(usize::MAX));
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
        fn counts_read_every_integer(n in any::<usize>()) {
            prop_assert_eq!(count(&n.to_string()), Ok(n));
            prop_assert_eq!(bytes(&n.to_string()), Ok(n));
        }

        #[test]
        fn millis_roundtrip(us in 0u64..10_000_000) {
            let text = format!("{}", us as f64 / 1000.0);
            let parsed = millis(&text).map(|d| d.as_micros() as i128);
            prop_assert!(parsed.is_ok_and(|p| (p - i128::from(us)).abs() <= 1));
        }
    }
}
