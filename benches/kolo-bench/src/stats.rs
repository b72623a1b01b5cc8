//! From per-rank iteration times to the reported time: each rank's report
//! travels to rank 0 as bytes over the control plane; rank 0 takes, per
//! iteration, the slowest rank, then the median over iterations.

use crate::error::BenchError;

/// What one rank measured for one size: its time per timed iteration (µs)
/// and how many elements of its last result were wrong (`None`: unchecked).
#[derive(Clone, Debug, PartialEq)]
pub struct RankReport {
    pub times_us: Vec<f64>,
    pub wrong: Option<u64>,
}

const UNCHECKED: u64 = u64::MAX;

/// Times reserved up front per size (more grow the vector, outside the
/// timed call): a huge `--iters` is refused by the memory check, not by
/// an allocation made before it.
pub const RESERVED_TIMES: usize = 1 << 16;

impl RankReport {
    /// Little-endian bytes: the wrong count (`u64::MAX` for unchecked), then
    /// each time as an `f64`.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(8 * (1 + self.times_us.len()));
        bytes.extend_from_slice(&self.wrong.unwrap_or(UNCHECKED).to_le_bytes());
        for t in &self.times_us {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        bytes
    }

    /// The inverse of [`RankReport::encode`]; `rank` names the sender in the
    /// error when the bytes are not a report.
    pub fn decode(bytes: &[u8], rank: usize) -> Result<RankReport, BenchError> {
        if bytes.len() < 8 || bytes.len() % 8 != 0 {
            return Err(BenchError::MalformedReport {
                rank,
                reason: format!(
                    "{} bytes is not a whole number of 8-byte words (at least 1)",
                    bytes.len()
                ),
            });
        }
        let mut words = bytes.chunks_exact(8).map(|w| {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            word
        });
        let wrong = words
            .next()
            .map(u64::from_le_bytes)
            .filter(|&w| w != UNCHECKED);
        let times_us = words.map(f64::from_le_bytes).collect();
        Ok(RankReport { times_us, wrong })
    }
}

/// The median of `values` (the mean of the two middle values for an even
/// count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// Rank 0's summary of one size: the median over iterations of the slowest
/// rank's time, and the wrong elements summed over ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub time_us: f64,
    pub wrong: Option<u64>,
}

/// Combines every rank's report (in rank order). All ranks must report the
/// same number of iterations; any rank unchecked makes the sum unchecked.
pub fn summarize(reports: &[RankReport]) -> Result<Summary, BenchError> {
    let Some(first) = reports.first() else {
        return Err(BenchError::MalformedReport {
            rank: 0,
            reason: "no rank reported".to_string(),
        });
    };
    let iters = first.times_us.len();
    if let Some((rank, r)) = reports
        .iter()
        .enumerate()
        .find(|(_, r)| r.times_us.len() != iters)
    {
        return Err(BenchError::MalformedReport {
            rank,
            reason: format!(
                "{} iterations timed, rank 0 timed {iters}",
                r.times_us.len()
            ),
        });
    }
    let slowest: Vec<f64> = (0..iters)
        .map(|i| {
            reports
                .iter()
                .map(|r| r.times_us[i])
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .collect();
    let wrong = reports.iter().map(|r| r.wrong).sum::<Option<u64>>();
    Ok(Summary {
        time_us: median(&slowest).unwrap_or(0.0),
        wrong,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn summary_is_median_of_per_iteration_max() {
        let reports = vec![
            RankReport {
                times_us: vec![1.0, 10.0, 3.0],
                wrong: Some(0),
            },
            RankReport {
                times_us: vec![2.0, 1.0, 4.0],
                wrong: Some(2),
            },
        ];
        // Slowest per iteration: 2, 10, 4 -> median 4.
        let s = summarize(&reports).unwrap();
        assert_eq!(
            s,
            Summary {
                time_us: 4.0,
                wrong: Some(2)
            }
        );
    }

    #[test]
    fn unchecked_rank_makes_the_sum_unchecked() {
        let reports = vec![
            RankReport {
                times_us: vec![1.0],
                wrong: Some(0),
            },
            RankReport {
                times_us: vec![1.0],
                wrong: None,
            },
        ];
        assert_eq!(summarize(&reports).unwrap().wrong, None);
    }

    #[test]
    fn mismatched_iterations_name_the_rank() {
        let reports = vec![
            RankReport {
                times_us: vec![1.0, 2.0],
                wrong: Some(0),
            },
            RankReport {
                times_us: vec![1.0],
                wrong: Some(0),
            },
        ];
        let err = summarize(&reports).unwrap_err();
        assert!(
            matches!(err, BenchError::MalformedReport { rank: 1, .. }),
            "{err}"
        );
        assert!(summarize(&[]).is_err());
    }

    #[test]
    fn malformed_bytes_are_an_error_naming_the_rank() {
        for bytes in [&[][..], &[1, 2, 3][..], &[0; 12][..]] {
            let err = RankReport::decode(bytes, 3).unwrap_err();
            assert!(
                matches!(err, BenchError::MalformedReport { rank: 3, .. }),
                "{err}"
            );
        }
    }

    proptest! {
        #[test]
        fn encode_decode_roundtrip(times in prop::collection::vec(0.0f64..1e9, 0..50), wrong in prop::option::of(0u64..u64::MAX)) {
            let report = RankReport { times_us: times, wrong };
            prop_assert_eq!(RankReport::decode(&report.encode(), 0).unwrap(), report);
        }

        #[test]
        fn decode_accepts_exactly_whole_words(bytes in prop::collection::vec(any::<u8>(), 0..100)) {
            let whole = bytes.len() >= 8 && bytes.len() % 8 == 0;
            prop_assert_eq!(RankReport::decode(&bytes, 0).is_ok(), whole);
        }
    }
}
