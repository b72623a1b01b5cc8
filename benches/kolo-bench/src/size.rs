//! Byte sizes on the command line (`8`, `64K`, `16M`, `1G`) and the
//! geometric sweep between two of them.

use crate::error::BenchError;

/// Parses a byte count with an optional binary suffix: `K` (KiB), `M` (MiB)
/// or `G` (GiB), case-insensitive, optionally followed by `B` or `iB`
/// (`64K`, `64k`, `64KiB` and `65536` are the same size).
///
/// Errors name the offending text: empty input, no digits, an unknown
/// suffix, or a value that overflows `usize`.
pub fn parse_size(text: &str) -> Result<usize, BenchError> {
    let invalid = |reason: &str| BenchError::InvalidSize {
        value: text.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(invalid("expected a number of bytes, e.g. 8, 64K, 16M, 1G"));
    }
    let number: usize = digits
        .parse()
        .map_err(|_| invalid("the number does not fit in 64 bits"))?;
    let multiplier: usize = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(invalid("unknown suffix (use K, M or G)")),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| invalid("the size does not fit in 64 bits"))
}

/// Formats a byte count with the largest binary suffix that divides it
/// exactly (`65536` -> `64K`); the inverse of [`parse_size`].
pub fn format_size(bytes: usize) -> String {
    const UNITS: [(usize, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (unit, suffix) in UNITS {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// A byte count for messages: the exact count, with its size in the
/// largest binary unit it reaches (`10737418240 B (10.0 GiB)`).
pub fn describe_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    match UNITS.iter().find(|&&(unit, _)| bytes >= unit) {
        Some(&(unit, name)) => format!("{bytes} B ({:.1} {name})", bytes as f64 / unit as f64),
        None => format!("{bytes} B"),
    }
}

/// The sizes `min, min*factor, min*factor^2, ...` up to and including `max`
/// (nccl-tests' `-b`, `-e`, `-f`).
///
/// `min` must be at least 1, `min <= max` and `factor >= 2`; anything else
/// is an error naming the values.
pub fn sweep(min: usize, max: usize, factor: usize) -> Result<Vec<usize>, BenchError> {
    if min == 0 {
        return Err(BenchError::InvalidSweep(
            "--min-bytes must be at least 1".to_string(),
        ));
    }
    if min > max {
        return Err(BenchError::InvalidSweep(format!(
            "--min-bytes {min} is larger than --max-bytes {max}"
        )));
    }
    if factor < 2 {
        return Err(BenchError::InvalidSweep(format!(
            "--factor {factor} must be at least 2"
        )));
    }
    let mut sizes = Vec::new();
    let mut size = min;
    loop {
        sizes.push(size);
        match size.checked_mul(factor) {
            Some(next) if next <= max => size = next,
            _ => break,
        }
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("16M").unwrap(), 16 << 20);
        assert_eq!(parse_size("16mb").unwrap(), 16 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("128B").unwrap(), 128);
        assert_eq!(parse_size(" 4K ").unwrap(), 4096);
    }

    #[test]
    fn bad_input_names_the_value() {
        for bad in [
            "",
            "K",
            "12X",
            "1.5M",
            "-8",
            "abc",
            "99999999999999999999",
            "16777216T",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert!(
                matches!(&err, BenchError::InvalidSize { value, .. } if value == bad),
                "{bad:?} gave {err:?}"
            );
            assert!(err.to_string().contains(bad), "{err} should name {bad:?}");
        }
        let overflow = parse_size("17179869184G").unwrap_err();
        assert!(overflow.to_string().contains("64 bits"), "{overflow}");
    }

    #[test]
    fn described_bytes_keep_the_exact_count() {
        assert_eq!(describe_bytes(0), "0 B");
        assert_eq!(describe_bytes(1023), "1023 B");
        assert_eq!(describe_bytes(1536), "1536 B (1.5 KiB)");
        assert_eq!(describe_bytes(10 << 30), "10737418240 B (10.0 GiB)");
        assert!(describe_bytes(u64::MAX).ends_with("TiB)"));
    }

    #[test]
    fn sweep_examples() {
        assert_eq!(sweep(8, 64, 2).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(sweep(8, 100, 4).unwrap(), vec![8, 32]);
        assert_eq!(sweep(5, 5, 2).unwrap(), vec![5]);
        assert_eq!(sweep(8, 64 << 20, 2).unwrap().len(), 24);
    }

    #[test]
    fn sweep_rejects_bad_bounds() {
        assert!(sweep(0, 8, 2)
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
        let err = sweep(64, 8, 2).unwrap_err().to_string();
        assert!(err.contains("64") && err.contains('8'), "{err}");
        assert!(sweep(8, 64, 1)
            .unwrap_err()
            .to_string()
            .contains("--factor 1"));
        assert_eq!(
            sweep(usize::MAX / 2, usize::MAX, 4).unwrap(),
            vec![usize::MAX / 2]
        );
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(bytes in 0usize..(1 << 40)) {
            prop_assert_eq!(parse_size(&format_size(bytes)).unwrap(), bytes);
        }

        #[test]
        fn sweep_is_geometric_and_bounded(min in 1usize..1 << 20, span in 0usize..1 << 30, factor in 2usize..10) {
            let max = min + span;
            let sizes = sweep(min, max, factor).unwrap();
            prop_assert_eq!(sizes[0], min);
            prop_assert!(sizes.iter().all(|&s| s <= max));
            for pair in sizes.windows(2) {
                prop_assert_eq!(pair[1], pair[0] * factor);
            }
            // Maximal: one more step would pass max.
            let last = *sizes.last().unwrap();
            prop_assert!(last.checked_mul(factor).is_none_or(|next| next > max));
        }
    }
}
