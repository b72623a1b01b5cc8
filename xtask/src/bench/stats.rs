//! Medians and ratios over interleaved rounds: the machines are shared and
//! drift, so every comparison is made within a round and summarised by
//! its median.

/// The median of `values` (the mean of the middle two for an even count),
/// or NaN for none.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `b[i] / a[i]` for every round.
pub(crate) fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| b / a).collect()
}

/// The median of the per-round ratios `b / a`.
pub(crate) fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    median(&ratios(a, b))
}

/// The rounds whose ratio reaches `at_least`.
pub(crate) fn reaching(ratios: &[f64], at_least: f64) -> usize {
    ratios.iter().filter(|r| **r >= at_least).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        let fused = [100.0, 200.0, 400.0];
        let unfused = [1000.0, 1000.0, 1000.0];
        assert_eq!(ratios(&fused, &unfused), [10.0, 5.0, 2.5]);
        assert_eq!(median_ratio(&fused, &unfused), 5.0);
        assert_eq!(reaching(&ratios(&fused, &unfused), 5.0), 2);
    }
}
