//! The known per-rank inputs and the reference each rank's output is
//! checked against, as pure functions over `f64`.
//!
//! Every value passes through the benchmarked element type before use
//! (`round = |v| T::from_f64(v).to_f64()`), so the reference sees exactly
//! the inputs the collective saw. Reduction inputs are small integers, so
//! sums over many ranks stay exact in every dtype (u8 up to 85 ranks) and
//! integers compare exactly; floats compare with a tolerance for the
//! rounding of averages.

use crate::op::{BenchOp, Layout};
use kolo_protocol::{DataType, ReduceOp};

/// Element `index` of rank `rank`'s input to a reduction: 0..=3, or 1 and 2
/// for products (so a product over ranks stays small).
pub fn reduce_input(redop: ReduceOp, rank: usize, index: usize) -> f64 {
    match redop {
        ReduceOp::Product => {
            if (rank + index) % 3 == 0 {
                2.0
            } else {
                1.0
            }
        }
        _ => ((rank * 7 + index * 3) % 4) as f64,
    }
}

/// Element `index` of rank `rank`'s data for the copying collectives: 1..=251,
/// different per rank and position so a misplaced block is seen.
pub fn copy_input(rank: usize, index: usize) -> f64 {
    ((rank * 131 + index * 7 + 1) % 251) as f64
}

/// `redop` over every rank's input at `index`, as the dtype computes it:
/// booleans reduce logically, `Average` divides floats and truncates
/// integers (the `Element::scale` rule), and the result is rounded through
/// the dtype with `round`.
pub fn reduce_expected(
    dtype: DataType,
    redop: ReduceOp,
    n: usize,
    index: usize,
    round: &impl Fn(f64) -> f64,
) -> f64 {
    let inputs = (0..n).map(|r| round(reduce_input(redop, r, index)));
    let reduced = match redop {
        ReduceOp::Sum | ReduceOp::Average => inputs.sum(),
        ReduceOp::Product => inputs.product(),
        ReduceOp::Min => inputs.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => inputs.fold(f64::NEG_INFINITY, f64::max),
    };
    let value = if dtype == DataType::Bool {
        // Sum is OR and product is AND over 0 / 1; average leaves bools alone.
        f64::from(reduced != 0.0)
    } else if redop == ReduceOp::Average {
        let factor = 1.0 / n as f64;
        if dtype.is_float() {
            reduced * factor
        } else {
            (reduced * factor).trunc()
        }
    } else {
        reduced
    };
    round(value)
}

/// One checked collective: what runs, on which dtype, over how many ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    pub op: BenchOp,
    pub dtype: DataType,
    /// The reduction (ignored by the copying ops).
    pub redop: ReduceOp,
    pub layout: Layout,
    /// Number of ranks.
    pub ranks: usize,
}

impl Spec {
    /// Element `index` of rank `rank`'s send buffer (the in-place buffer
    /// for allreduce and broadcast) before the collective.
    pub fn send_value(&self, rank: usize, index: usize) -> f64 {
        match self.op {
            BenchOp::Allreduce | BenchOp::Reducescatter => reduce_input(self.redop, rank, index),
            // Rank r's block is block r of the gathered array.
            BenchOp::Allgather => copy_input(rank, rank * self.layout.block + index),
            BenchOp::Broadcast | BenchOp::Sendrecv | BenchOp::Alltoall => copy_input(rank, index),
        }
    }

    /// How often [`Spec::send_value`] repeats along a buffer:
    /// `send_value(r, i + period) == send_value(r, i)` for every `i`, so a
    /// buffer is filled (and refilled between iterations) from one period
    /// instead of from a pristine copy of the whole input.
    pub fn send_period(&self) -> usize {
        match self.op {
            // `(7 r + 3 i) % 4` repeats every 4 elements, products'
            // `(r + i) % 3` every 3.
            BenchOp::Allreduce | BenchOp::Reducescatter => 12,
            // `copy_input`'s `7 i % 251`.
            BenchOp::Allgather | BenchOp::Broadcast | BenchOp::Sendrecv | BenchOp::Alltoall => 251,
        }
    }

    /// The value rank `rank` must hold at element `index` of its receive
    /// buffer (the in-place buffer for allreduce and broadcast) after the
    /// collective.
    pub fn expected(&self, rank: usize, index: usize, round: &impl Fn(f64) -> f64) -> f64 {
        let (n, block) = (self.ranks, self.layout.block);
        let value = match self.op {
            BenchOp::Allreduce => return reduce_expected(self.dtype, self.redop, n, index, round),
            BenchOp::Reducescatter => {
                return reduce_expected(self.dtype, self.redop, n, rank * block + index, round)
            }
            BenchOp::Allgather => copy_input(index / block, index),
            BenchOp::Broadcast => copy_input(0, index),
            BenchOp::Alltoall => copy_input(index / block, rank * block + index % block),
            BenchOp::Sendrecv => copy_input((rank + n - 1) % n, index),
        };
        round(value)
    }
}

/// Half the distance to the next representable value above 1, times a few
/// roundings: how far a float result may stray from the f64 reference.
pub fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F16 => 4.0 * 9.77e-4,
        DataType::BF16 => 4.0 * 7.82e-3,
        DataType::F32 => 4.0 * 1.2e-7,
        DataType::F64 => 4.0 * 2.3e-16,
        _ => 0.0,
    }
}

/// Whether `got` is `expected` for `dtype`: exactly for integers and bool,
/// within [`tolerance`] relative to `max(1, |expected|)` for floats.
pub fn matches(dtype: DataType, got: f64, expected: f64) -> bool {
    if dtype.is_float() {
        (got - expected).abs() <= tolerance(dtype) * expected.abs().max(1.0)
    } else {
        got == expected
    }
}

/// How many of `got` differ from `expected(index)`.
pub fn count_wrong(
    dtype: DataType,
    got: impl IntoIterator<Item = f64>,
    expected: impl Fn(usize) -> f64,
) -> u64 {
    got.into_iter()
        .enumerate()
        .filter(|&(i, g)| !matches(dtype, g, expected(i)))
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn exact(v: f64) -> f64 {
        v
    }

    /// Runs the collective by definition, on f64 vectors, for `n` ranks.
    fn simulate(spec: &Spec) -> Vec<Vec<f64>> {
        let (op, redop, layout, n) = (spec.op, spec.redop, spec.layout, spec.ranks);
        let sends: Vec<Vec<f64>> = (0..n)
            .map(|r| (0..layout.send).map(|i| spec.send_value(r, i)).collect())
            .collect();
        let reduce = |i: usize| -> f64 {
            let column = sends.iter().map(|s| s[i]);
            match redop {
                ReduceOp::Sum => column.sum(),
                ReduceOp::Average => column.sum::<f64>() / n as f64,
                ReduceOp::Product => column.product(),
                ReduceOp::Min => column.fold(f64::INFINITY, f64::min),
                ReduceOp::Max => column.fold(f64::NEG_INFINITY, f64::max),
            }
        };
        (0..n)
            .map(|r| match op {
                BenchOp::Allreduce => (0..layout.count).map(reduce).collect(),
                BenchOp::Reducescatter => (0..layout.block)
                    .map(|j| reduce(r * layout.block + j))
                    .collect(),
                BenchOp::Allgather => sends.concat(),
                BenchOp::Broadcast => sends[0].clone(),
                BenchOp::Sendrecv => sends[(r + n - 1) % n].clone(),
                BenchOp::Alltoall => (0..n)
                    .flat_map(|p| sends[p][r * layout.block..(r + 1) * layout.block].to_vec())
                    .collect(),
            })
            .collect()
    }

    proptest! {
        /// The reference agrees with the collectives' definitions.
        #[test]
        fn reference_matches_definition(n in 1usize..6, bytes in 1usize..256, op_i in 0usize..6, redop_i in 0usize..5) {
            let op = BenchOp::ALL[op_i];
            let redop = ReduceOp::ALL[redop_i];
            let layout = op.layout(bytes, 8, n);
            let spec = Spec { op, dtype: DataType::F64, redop, layout, ranks: n };
            for (rank, out) in simulate(&spec).iter().enumerate() {
                prop_assert_eq!(out.len(), layout.recv);
                let wrong = count_wrong(DataType::F64, out.iter().copied(), |i| spec.expected(rank, i, &exact));
                prop_assert_eq!(wrong, 0);
            }
        }
    }

    proptest! {
        /// Filling a buffer from one period gives the same inputs.
        #[test]
        fn send_values_repeat_with_their_period(n in 1usize..9, rank_pick in 0usize..8, bytes in 1usize..1 << 20, index in 0usize..1 << 20, op_i in 0usize..6, redop_i in 0usize..5) {
            let op = BenchOp::ALL[op_i];
            let spec = Spec { op, dtype: DataType::F32, redop: ReduceOp::ALL[redop_i], layout: op.layout(bytes, 4, n), ranks: n };
            let rank = rank_pick % n;
            let period = spec.send_period();
            prop_assert_eq!(spec.send_value(rank, index + period), spec.send_value(rank, index));
        }
    }

    #[test]
    fn a_wrong_element_is_counted() {
        let layout = BenchOp::Allgather.layout(64, 4, 2);
        let spec = Spec {
            op: BenchOp::Allgather,
            dtype: DataType::I32,
            redop: ReduceOp::Sum,
            layout,
            ranks: 2,
        };
        let mut out = simulate(&spec).remove(1);
        out[3] += 1.0;
        out.swap(0, layout.block); // a misplaced block
        let wrong = count_wrong(DataType::I32, out.iter().copied(), |i| {
            spec.expected(1, i, &exact)
        });
        assert_eq!(wrong, 3);
    }

    #[test]
    fn integer_average_truncates_and_bool_is_logical() {
        // Inputs at index 1 over 2 ranks: 3 and 2 -> sum 5, average 2.5.
        assert_eq!(reduce_input(ReduceOp::Sum, 0, 1), 3.0);
        assert_eq!(reduce_input(ReduceOp::Sum, 1, 1), 2.0);
        assert_eq!(
            reduce_expected(DataType::I32, ReduceOp::Average, 2, 1, &exact),
            2.0
        );
        assert_eq!(
            reduce_expected(DataType::F32, ReduceOp::Average, 2, 1, &exact),
            2.5
        );
        let as_bool = |v: f64| f64::from(v != 0.0);
        assert_eq!(
            reduce_expected(DataType::Bool, ReduceOp::Sum, 2, 1, &as_bool),
            1.0
        );
        // Index 0: rank 0 has 0, rank 1 has 7 % 4 = 3 -> AND is false, OR true.
        assert_eq!(
            reduce_expected(DataType::Bool, ReduceOp::Min, 2, 0, &as_bool),
            0.0
        );
        // Product inputs are 1 or 2: all true.
        assert_eq!(
            reduce_expected(DataType::Bool, ReduceOp::Product, 2, 0, &as_bool),
            1.0
        );
        assert_eq!(
            reduce_expected(DataType::Bool, ReduceOp::Max, 2, 0, &as_bool),
            1.0
        );
    }

    #[test]
    fn sums_stay_small_enough_for_every_dtype() {
        for index in 0..64 {
            assert!(reduce_expected(DataType::U8, ReduceOp::Sum, 85, index, &exact) <= 255.0);
            assert!(reduce_expected(DataType::I8, ReduceOp::Product, 18, index, &exact) <= 127.0);
        }
    }

    #[test]
    fn float_tolerance_is_relative_and_integers_are_exact() {
        assert!(matches(DataType::F32, 1000.0001, 1000.0));
        assert!(!matches(DataType::F32, 1001.0, 1000.0));
        assert!(matches(DataType::BF16, 2.5 * 1.01, 2.5));
        assert!(!matches(DataType::F16, f64::NAN, 1.0));
        assert!(!matches(DataType::I64, 3.0000001, 3.0));
        assert!(matches(DataType::Bool, 1.0, 1.0));
    }
}
