//! The same-run comparison (`--baseline`, `--compare`): for each op and
//! size measured more than one way in this run — plain `MPI_Allreduce`,
//! kolo's backend directly, the kolo engine — the times side by side, how
//! far the direct call is from plain MPI, and the engine's extra cost per
//! operation (engine time minus direct time).

use crate::op::BenchOp;
use crate::row::{Mode, Row};

/// One op and size as measured in this run (times in µs: the median over
/// iterations of the slowest rank).
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub op: BenchOp,
    /// Bytes of the reported array.
    pub size: usize,
    pub baseline_us: Option<f64>,
    pub direct_us: Option<f64>,
    /// Engine rows with one tensor per step only (a step of K tensors is
    /// not one operation).
    pub engine_us: Option<f64>,
}

impl Comparison {
    /// How much slower (positive) or faster (negative) kolo's direct call
    /// was than plain MPI, in percent of the MPI time.
    pub fn direct_vs_baseline_pct(&self) -> Option<f64> {
        match (self.direct_us, self.baseline_us) {
            (Some(d), Some(b)) if b > 0.0 => Some((d / b - 1.0) * 100.0),
            _ => None,
        }
    }

    /// The engine's extra cost per operation: engine minus direct, in µs.
    pub fn engine_extra_us(&self) -> Option<f64> {
        Some(self.engine_us? - self.direct_us?)
    }
}

/// `rows` grouped by (op, size), in the order each pair first appears.
pub fn compare(rows: &[Row]) -> Vec<Comparison> {
    let mut out: Vec<Comparison> = Vec::new();
    for row in rows {
        if row.mode == Mode::Engine && row.tensors != 1 {
            continue;
        }
        let index = match out
            .iter()
            .position(|c| c.op == row.op && c.size == row.size)
        {
            Some(i) => i,
            None => {
                out.push(Comparison {
                    op: row.op,
                    size: row.size,
                    baseline_us: None,
                    direct_us: None,
                    engine_us: None,
                });
                out.len() - 1
            }
        };
        let slot = match row.mode {
            Mode::Baseline => &mut out[index].baseline_us,
            Mode::Direct => &mut out[index].direct_us,
            Mode::Engine => &mut out[index].engine_us,
        };
        *slot = Some(row.time_us);
    }
    out
}

fn cell(value: Option<f64>, width: usize, sign: bool) -> String {
    match value {
        Some(v) if sign => format!("{v:>+width$.2}"),
        Some(v) => format!("{v:>width$.2}"),
        None => format!("{:>width$}", "-"),
    }
}

/// The comparison table of `rows`, or `None` when no op and size was
/// measured more than one way.
pub fn comparison_table(rows: &[Row]) -> Option<String> {
    let lines: Vec<String> = compare(rows)
        .iter()
        .filter(|c| {
            [c.baseline_us, c.direct_us, c.engine_us]
                .iter()
                .filter(|t| t.is_some())
                .count()
                > 1
        })
        .map(|c| {
            format!(
                "{:>14} {:>12} {} {} {} {} {}",
                c.op.name(),
                c.size,
                cell(c.baseline_us, 10, false),
                cell(c.direct_us, 10, false),
                cell(c.direct_vs_baseline_pct(), 9, true),
                cell(c.engine_us, 10, false),
                cell(c.engine_extra_us(), 13, true),
            )
        })
        .collect();
    if lines.is_empty() {
        return None;
    }
    let header = format!(
        "# same-run comparison (median of the slowest rank, us; vs MPI: kolo direct \
         relative to plain MPI_Allreduce, + is slower)\n#{:>13} {:>12} {:>10} {:>10} {:>9} {:>10} {:>13}",
        "op", "size (B)", "MPI", "direct", "vs MPI %", "engine", "engine-direct"
    );
    Some(format!("{header}\n{}", lines.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::Spec;
    use crate::row::RunInfo;
    use crate::stats::Summary;
    use kolo_protocol::{DataType, ReduceOp};
    use proptest::prelude::*;

    fn row(op: BenchOp, bytes: usize, mode: Mode, tensors: usize, time_us: f64) -> Row {
        let info = RunInfo {
            mode,
            backend: "mpi".into(),
            tensors,
        };
        let spec = Spec {
            op,
            dtype: DataType::F32,
            redop: ReduceOp::Sum,
            layout: op.layout(bytes, 4, 2),
            ranks: 2,
        };
        Row::new(
            &info,
            &spec,
            Summary {
                time_us,
                wrong: Some(0),
            },
        )
    }

    #[test]
    fn joins_modes_by_op_and_size() {
        let rows = [
            row(BenchOp::Allreduce, 8, Mode::Direct, 1, 4.0),
            row(BenchOp::Allreduce, 1 << 20, Mode::Direct, 1, 200.0),
            row(BenchOp::Allreduce, 8, Mode::Baseline, 1, 5.0),
            row(BenchOp::Allreduce, 1 << 20, Mode::Baseline, 1, 190.0),
            row(BenchOp::Broadcast, 8, Mode::Direct, 1, 3.0),
            row(BenchOp::Allreduce, 8, Mode::Engine, 1, 54.0),
            row(BenchOp::Allreduce, 1 << 20, Mode::Engine, 4, 999.0),
        ];
        let c = compare(&rows);
        assert_eq!(c.len(), 3);
        assert_eq!(
            (c[0].baseline_us, c[0].direct_us, c[0].engine_us),
            (Some(5.0), Some(4.0), Some(54.0))
        );
        assert!((c[0].direct_vs_baseline_pct().unwrap() + 20.0).abs() < 1e-9);
        assert_eq!(c[0].engine_extra_us(), Some(50.0));
        assert_eq!(c[1].engine_us, None, "4-tensor steps are not one operation");
        assert!((c[1].direct_vs_baseline_pct().unwrap() - 5.263).abs() < 1e-3);
        let table = comparison_table(&rows).unwrap();
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(
            table.contains("-20.00") && table.contains("+50.00"),
            "{table}"
        );
        assert!(!table.contains("broadcast"), "one way only: {table}");
        assert_eq!(comparison_table(&rows[4..5]), None);
    }

    proptest! {
        #[test]
        fn every_row_lands_in_its_slot(times in proptest::collection::vec((0usize..3, 0usize..4, 0usize..3, 1.0f64..1e4), 0..40)) {
            let ops = [BenchOp::Allreduce, BenchOp::Allgather, BenchOp::Broadcast];
            let modes = [Mode::Direct, Mode::Engine, Mode::Baseline];
            let rows: Vec<Row> = times
                .iter()
                .map(|&(o, s, m, t)| row(ops[o], 8 << (2 * s), modes[m], 1, t))
                .collect();
            let c = compare(&rows);
            for r in &rows {
                let found = c.iter().filter(|c| c.op == r.op && c.size == r.size).count();
                prop_assert_eq!(found, 1);
            }
            // The last row of each (op, size, mode) wins its slot.
            for (i, r) in rows.iter().enumerate() {
                if rows[i + 1..].iter().any(|l| (l.op, l.size, l.mode) == (r.op, r.size, r.mode)) {
                    continue;
                }
                let cmp = c.iter().find(|c| c.op == r.op && c.size == r.size).unwrap();
                let slot = match r.mode {
                    Mode::Direct => cmp.direct_us,
                    Mode::Engine => cmp.engine_us,
                    Mode::Baseline => cmp.baseline_us,
                };
                prop_assert_eq!(slot, Some(r.time_us));
            }
        }
    }
}
