//! A rank's buffers, allocated without aborting and filled from one period
//! of the known input.
//!
//! Every buffer is reserved with `try_reserve_exact`, so a size the
//! allocator refuses is an error naming the op, the size and the element
//! count rather than an abort. Inputs repeat along the buffer
//! ([`Spec::send_period`]), so an in-place op refills its buffer from a
//! [`Pattern`] of a few thousand elements between iterations instead of
//! keeping a pristine copy of the whole input.

use crate::error::BenchError;
use crate::reference::Spec;
use kolo_transport::Element;

/// At least this many elements per pattern, so a refill copies long runs.
const PATTERN_ELEMENTS: usize = 4096;

/// Rank `rank`'s input for one spec, as whole periods of
/// [`Spec::send_value`]: element `k` of the input is `values[k % period]`.
#[derive(Clone, Debug)]
pub struct Pattern<T> {
    values: Vec<T>,
    period: usize,
}

impl<T: Element> Pattern<T> {
    /// The pattern of rank `rank`'s input for `spec`.
    pub fn new(spec: &Spec, rank: usize) -> Pattern<T> {
        let period = spec.send_period().max(1);
        let len = period * PATTERN_ELEMENTS.div_ceil(period);
        Pattern {
            values: (0..len)
                .map(|i| T::from_f64(spec.send_value(rank, i)))
                .collect(),
            period,
        }
    }

    /// The runs of input elements `start, start + 1, ...` covering `len`
    /// elements, each a slice of the pattern.
    fn runs(&self, start: usize, len: usize) -> impl Iterator<Item = &[T]> {
        let mut pos = start % self.period;
        let mut left = len;
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            let take = left.min(self.values.len() - pos);
            let run = &self.values[pos..pos + take];
            left -= take;
            // The pattern holds whole periods: where a run ends, the next
            // one starts at the same place in the period.
            pos = (pos + take) % self.period;
            Some(run)
        })
    }

    /// Overwrites `buf` with input elements `start, start + 1, ...`.
    pub fn fill(&self, buf: &mut [T], start: usize) {
        let mut at = 0;
        for run in self.runs(start, buf.len()) {
            buf[at..at + run.len()].copy_from_slice(run);
            at += run.len();
        }
    }

    /// Appends input elements `start, start + 1, ...`, `len` of them.
    fn extend(&self, buf: &mut Vec<T>, start: usize, len: usize) {
        for run in self.runs(start, len) {
            buf.extend_from_slice(run);
        }
    }
}

/// An empty vector with room for `len` elements; an error naming `spec`
/// when the allocator refuses.
fn reserve<T: Element>(spec: &Spec, len: usize) -> Result<Vec<T>, BenchError> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(len)
        .map_err(|e| BenchError::Allocation {
            op: spec.op.name(),
            bytes: spec.layout.bytes,
            elements: len,
            dtype: spec.dtype.name(),
            reason: e.to_string(),
        })?;
    Ok(buf)
}

/// `len` elements of input, from element `start` on.
pub fn input<T: Element>(
    spec: &Spec,
    pattern: &Pattern<T>,
    start: usize,
    len: usize,
) -> Result<Vec<T>, BenchError> {
    let mut buf = reserve(spec, len)?;
    pattern.extend(&mut buf, start, len);
    Ok(buf)
}

/// `len` default (zero) elements.
pub fn zeroed<T: Element>(spec: &Spec, len: usize) -> Result<Vec<T>, BenchError> {
    let mut buf = reserve(spec, len)?;
    buf.resize(len, T::default());
    Ok(buf)
}

/// The input parts `(start, len)`, one after the other, in one buffer.
pub fn gathered_input<T: Element>(
    spec: &Spec,
    pattern: &Pattern<T>,
    parts: impl Iterator<Item = (usize, usize)> + Clone,
) -> Result<Vec<T>, BenchError> {
    let total = parts
        .clone()
        .try_fold(0usize, |sum, (_, len)| sum.checked_add(len))
        .ok_or_else(|| BenchError::TooLarge {
            what: format!("{} of {} bytes", spec.op, spec.layout.bytes),
        })?;
    let mut buf = reserve(spec, total)?;
    for (start, len) in parts {
        pattern.extend(&mut buf, start, len);
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::BenchOp;
    use kolo_protocol::{DataType, ReduceOp};
    use proptest::prelude::*;

    fn spec(op: BenchOp, redop: ReduceOp, bytes: usize, ranks: usize) -> Spec {
        Spec {
            op,
            dtype: DataType::I32,
            redop,
            layout: op.layout(bytes, 4, ranks),
            ranks,
        }
    }

    proptest! {
        /// A buffer filled from the pattern holds exactly the inputs.
        #[test]
        fn pattern_fills_match_the_inputs(op_i in 0usize..6, redop_i in 0usize..5, rank in 0usize..4, start in 0usize..20_000, len in 0usize..20_000) {
            let spec = spec(BenchOp::ALL[op_i], ReduceOp::ALL[redop_i], 1 << 16, 4);
            let pattern = Pattern::<i32>::new(&spec, rank);
            let want: Vec<i32> = (start..start + len).map(|i| spec.send_value(rank, i) as i32).collect();
            prop_assert_eq!(&input(&spec, &pattern, start, len).unwrap(), &want);
            let mut buf = vec![-1i32; len];
            pattern.fill(&mut buf, start);
            prop_assert_eq!(&buf, &want);
            let parts = [(start, len / 2), (start / 3, len - len / 2)];
            let mut two: Vec<i32> = (start..start + len / 2).map(|i| spec.send_value(rank, i) as i32).collect();
            two.extend((start / 3..start / 3 + len - len / 2).map(|i| spec.send_value(rank, i) as i32));
            prop_assert_eq!(gathered_input(&spec, &pattern, parts.into_iter()).unwrap(), two);
        }
    }

    #[test]
    fn a_refused_allocation_is_an_error_naming_it() {
        let spec = spec(BenchOp::Allreduce, ReduceOp::Sum, 64, 2);
        let err = zeroed::<i32>(&spec, usize::MAX / 2)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("allreduce") && err.contains(&(usize::MAX / 2).to_string()),
            "{err}"
        );
        let pattern = Pattern::<i32>::new(&spec, 0);
        let err = gathered_input(&spec, &pattern, [(0, usize::MAX), (0, 2)].into_iter())
            .unwrap_err()
            .to_string();
        assert!(err.contains("2^64"), "{err}");
        assert_eq!(zeroed::<i32>(&spec, 3).unwrap(), vec![0; 3]);
    }
}
