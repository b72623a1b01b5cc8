//! Sequential references and the comparison of results against them.

use crate::failure::Failure;
use crate::values::{periodic, Stream, Values, PERIOD};
use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::{Element, Scale};

/// Elements per block of a reference computation (keeps memory flat for
/// the large cases).
const BLOCK: usize = 4096;

/// How closely a result must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exactness {
    /// Bit for bit (data movement; integer and bool reductions).
    Exact,
    /// A float reduction over `ranks` ranks: the order of operations, the
    /// rounding of partial results (f16 / bf16) and `Average`'s division
    /// may differ, within a few ulps per rank. Integers stay exact.
    Reduced { ranks: usize },
}

/// Unit roundoff of a float dtype.
fn epsilon(dtype: DataType) -> f64 {
    match dtype {
        DataType::F16 => 2f64.powi(-10),
        DataType::BF16 => 2f64.powi(-7),
        DataType::F32 => 2f64.powi(-23),
        _ => 2f64.powi(-52),
    }
}

/// Whether `got` is acceptable for `expected`.
pub(crate) fn close<T: Element>(expected: T, got: T, exactness: Exactness) -> bool {
    if expected == got {
        return true;
    }
    match exactness {
        Exactness::Reduced { ranks } if T::DTYPE.is_float() => {
            let (e, g) = (expected.to_f64(), got.to_f64());
            (e - g).abs() <= 2.0 * (ranks as f64 + 1.0) * epsilon(T::DTYPE) * e.abs().max(1.0)
        }
        _ => false,
    }
}

/// The first index where `got` and `expected` disagree, as a failure;
/// `offset` is added to the reported index.
pub(crate) fn compare<T: Element>(
    case: &str,
    rank: usize,
    offset: usize,
    expected: &[T],
    got: &[T],
    exactness: Exactness,
) -> Result<(), Failure> {
    if expected.len() != got.len() {
        return Err(crate::failure::check(
            case,
            rank,
            format!(
                "result has {} elements, expected {}",
                got.len(),
                expected.len()
            ),
        ));
    }
    match expected
        .iter()
        .zip(got)
        .position(|(e, g)| !close(*e, *g, exactness))
    {
        None => Ok(()),
        Some(i) => Err(Failure::Mismatch {
            case: case.to_owned(),
            rank,
            index: offset + i,
            expected: format!("{:?}", expected[i]),
            got: format!("{:?}", got[i]),
        }),
    }
}

/// Compares `got` (the elements at input indices `start..`) with what
/// `expected_at(index, out)` produces for blocks of it. Long buffers are
/// periodic (see [`PERIOD`]): one period of the reference is computed and
/// every period of `got` compared with it.
fn check_against<T: Element>(
    case: &str,
    rank: usize,
    offset: usize,
    got: &[T],
    start: u64,
    exactness: Exactness,
    mut expected_at: impl FnMut(u64, &mut [T]),
) -> Result<(), Failure> {
    if periodic(start, got.len()) {
        // On the heap: up to 512 KiB, too much for a rank thread's stack.
        let mut period: Vec<T> = std::iter::repeat_n(T::default(), PERIOD).collect();
        for (b, block) in period.chunks_mut(BLOCK).enumerate() {
            expected_at(start + (b * BLOCK) as u64, block);
        }
        for (k, got) in got.chunks(PERIOD).enumerate() {
            compare(
                case,
                rank,
                offset + k * PERIOD,
                &period[..got.len()],
                got,
                exactness,
            )?;
        }
    } else {
        let mut expected = vec![T::default(); BLOCK.min(got.len())];
        for (b, got) in got.chunks(BLOCK).enumerate() {
            let expected = &mut expected[..got.len()];
            expected_at(start + (b * BLOCK) as u64, expected);
            compare(case, rank, offset + b * BLOCK, expected, got, exactness)?;
        }
    }
    Ok(())
}

/// A reduction to check: every rank `r` of `ranks` contributed
/// `input(values, salt, r, i)` at index `i`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reduction {
    pub values: Values,
    pub salt: u64,
    pub ranks: usize,
    pub op: ReduceOp,
    pub scale: Scale,
}

impl Reduction {
    /// The expected `postscale' * op_r(prescale * input_r[i])` for
    /// `i in start..start + out.len()`: inputs prescaled one rank at a
    /// time, folded in rank order, then scaled once by
    /// [`Scale::postscale_for`] (what the contract prescribes for integers).
    /// `scratch` must be at least as long as `out`.
    fn expected<T: Element>(
        &self,
        streams: &[Stream<T>],
        start: u64,
        out: &mut [T],
        scratch: &mut [T],
    ) {
        let contribution = &mut scratch[..out.len()];
        out.fill(T::identity(self.op));
        for stream in streams {
            stream.fill(contribution, start);
            T::scale(contribution, self.scale.prescale);
            T::reduce_into(out, contribution, self.op);
        }
        T::scale(out, self.scale.postscale_for(self.op, self.ranks));
    }

    /// Checks `got`, the reduced elements `start..start + got.len()`;
    /// `offset` is added to reported indices.
    pub(crate) fn check<T: Element>(
        &self,
        case: &str,
        rank: usize,
        start: usize,
        got: &[T],
        offset: usize,
    ) -> Result<(), Failure> {
        let streams: Vec<Stream<T>> = (0..self.ranks)
            .map(|r| Stream::new(self.values, self.salt, r))
            .collect();
        let mut scratch = vec![T::default(); BLOCK];
        let exactness = Exactness::Reduced { ranks: self.ranks };
        check_against(
            case,
            rank,
            offset,
            got,
            start as u64,
            exactness,
            |at, out| self.expected(&streams, at, out, &mut scratch),
        )
    }
}

/// Where a block of inputs comes from: rank `rank`'s inputs of a case,
/// starting at index `start`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inputs {
    pub values: Values,
    pub salt: u64,
    pub rank: usize,
    pub start: u64,
}

/// Checks that `got` is exactly the inputs `source` describes; `offset` is
/// added to reported indices.
pub(crate) fn check_inputs<T: Element>(
    case: &str,
    rank: usize,
    offset: usize,
    got: &[T],
    source: Inputs,
) -> Result<(), Failure> {
    let stream = Stream::new(source.values, source.salt, source.rank);
    check_against(
        case,
        rank,
        offset,
        got,
        source.start,
        Exactness::Exact,
        |at, out| stream.fill(out, at),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::{input, inputs};
    use half::f16;

    #[test]
    fn floats_get_a_tolerance_integers_do_not() {
        let reduced = Exactness::Reduced { ranks: 4 };
        assert!(close(
            f16::from_f32(3.0),
            f16::from_f32(3.0),
            Exactness::Exact
        ));
        assert!(close(f16::from_f32(1000.0), f16::from_f32(1000.5), reduced));
        assert!(!close(
            f16::from_f32(1000.0),
            f16::from_f32(1000.5),
            Exactness::Exact
        ));
        assert!(!close(3i32, 4, reduced));
        assert!(!close(1.0f32, 1.01, reduced));
    }

    #[test]
    fn mismatch_names_index_expected_and_got() {
        let err = compare("case x", 2, 10, &[1u8, 2, 3], &[1, 2, 4], Exactness::Exact).unwrap_err();
        assert_eq!(
            err.to_string(),
            "case x: rank 2, index 12: expected 3, got 4"
        );
    }

    fn integer_average(salt: u64, ranks: usize, start: usize, len: usize) -> Vec<i32> {
        (start..start + len)
            .map(|i| {
                let sum: i32 = (0..ranks)
                    .map(|r| input::<i32>(Values::General, salt, r, i as u64))
                    .sum();
                (sum as f64 * (1.0 / ranks as f64)) as i32
            })
            .collect()
    }

    #[test]
    fn integer_average_reference_truncates() {
        let reduction = Reduction {
            values: Values::General,
            salt: 7,
            ranks: 3,
            op: ReduceOp::Average,
            scale: Scale::NONE,
        };
        let want = integer_average(7, 3, 5, 100);
        assert!(reduction.check("avg", 0, 5, &want, 0).is_ok());
        let mut wrong = want.clone();
        wrong[42] += 1;
        let err = reduction.check("avg", 0, 5, &wrong, 0).unwrap_err();
        assert!(matches!(err, Failure::Mismatch { index: 42, .. }), "{err}");
    }

    #[test]
    fn long_buffers_are_checked_period_by_period() {
        let len = 2 * PERIOD + 1000;
        let reduction = Reduction {
            values: Values::General,
            salt: 9,
            ranks: 2,
            op: ReduceOp::Average,
            scale: Scale::NONE,
        };
        let want = integer_average(9, 2, 0, len);
        assert!(reduction.check("long", 1, 0, &want, 0).is_ok());
        let mut wrong = want.clone();
        let at = PERIOD + 17;
        wrong[at] = wrong[at].wrapping_add(1);
        let err = reduction.check("long", 1, 0, &wrong, 0).unwrap_err();
        assert!(
            matches!(err, Failure::Mismatch { index, .. } if index == at),
            "{err}"
        );

        let data: Vec<u16> = inputs(len, Values::General, 3, 1, 12);
        let source = Inputs {
            values: Values::General,
            salt: 3,
            rank: 1,
            start: 12,
        };
        assert!(check_inputs("inputs", 0, 0, &data, source).is_ok());
        let mut shifted = data.clone();
        shifted.rotate_left(PERIOD / 2);
        assert!(check_inputs("inputs", 0, 0, &shifted, source).is_err());
    }
}
