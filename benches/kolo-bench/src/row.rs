//! One result row, its line in the nccl-tests-style table, and its JSON.

use crate::op::BenchOp;
use crate::reference::Spec;
use crate::stats::Summary;
use serde::{Deserialize, Serialize};

/// Whether a row measured a backend's collective directly, the whole kolo
/// engine (negotiation, fusion, background thread), or the plain library
/// call kolo is compared with (`--baseline`: MPI_Allreduce, same buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Direct,
    Engine,
    Baseline,
}

/// What is common to every row of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunInfo {
    pub mode: Mode,
    /// The backend's name (`threads`, ...).
    pub backend: String,
    /// Tensors per step (1 in direct mode).
    pub tensors: usize,
}

/// One measured size: the table's columns plus the run's context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub op: BenchOp,
    pub mode: Mode,
    pub backend: String,
    pub ranks: usize,
    /// Tensors per step (the engine splits `size` over them).
    pub tensors: usize,
    /// Bytes of the reported array (nccl-tests' `size`).
    pub size: usize,
    /// Elements of the reported array.
    pub count: usize,
    /// The dtype's name (`f32`, `bf16`, ...).
    #[serde(rename = "type")]
    pub dtype: String,
    /// The reduction's name, or `none` for the copying ops.
    pub redop: String,
    /// Median over iterations of the slowest rank's time, in µs.
    pub time_us: f64,
    /// `size / time`, in GB/s (1e9 bytes per second).
    pub algbw: f64,
    /// `algbw` times the op's bus-bandwidth factor, in GB/s.
    pub busbw: f64,
    /// Wrong elements of the last iteration summed over ranks; `None` with
    /// `--no-check`.
    pub wrong: Option<u64>,
}

impl Row {
    /// The row of `spec` measured as `summary` in the run `info`.
    pub fn new(info: &RunInfo, spec: &Spec, summary: Summary) -> Row {
        let bytes = spec.layout.bytes;
        let algbw = if summary.time_us > 0.0 {
            bytes as f64 / summary.time_us / 1e3
        } else {
            0.0
        };
        Row {
            op: spec.op,
            mode: info.mode,
            backend: info.backend.clone(),
            ranks: spec.ranks,
            tensors: info.tensors,
            size: bytes,
            count: spec.layout.count,
            dtype: spec.dtype.name().to_string(),
            redop: if spec.op.reduces() {
                spec.redop.name().to_string()
            } else {
                "none".to_string()
            },
            time_us: summary.time_us,
            algbw,
            busbw: algbw * spec.op.busbw_factor(spec.ranks),
            wrong: summary.wrong,
        }
    }
}

/// The comment line that opens one op's table.
pub fn table_title(op: BenchOp, info: &RunInfo, ranks: usize) -> String {
    match info.mode {
        Mode::Direct => format!("# {op}: {} backend, {ranks} ranks", info.backend),
        Mode::Engine => format!(
            "# {op}: {} backend, {ranks} ranks, kolo engine, {} tensor(s) per step",
            info.backend, info.tensors
        ),
        Mode::Baseline => {
            format!("# {op}: plain MPI_Allreduce baseline (in place, same loop), {ranks} ranks")
        }
    }
}

/// The two header lines of the table (names, then units).
pub fn table_header() -> String {
    format!(
        "#{:>11} {:>13} {:>6} {:>7} {:>11} {:>8} {:>8} {:>7}\n#{:>11} {:>13} {:>6} {:>7} {:>11} {:>8} {:>8} {:>7}",
        "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong",
        "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    )
}

/// One table line, aligned under [`table_header`]; `N/A` when unchecked.
pub fn table_line(row: &Row) -> String {
    let wrong = row
        .wrong
        .map_or_else(|| "N/A".to_string(), |w| w.to_string());
    format!(
        "{:>12} {:>13} {:>6} {:>7} {:>11.2} {:>8.3} {:>8.3} {:>7}",
        row.size, row.count, row.dtype, row.redop, row.time_us, row.algbw, row.busbw, wrong
    )
}

/// nccl-tests' closing lines: the wrong values in total and the average bus
/// bandwidth over `rows`.
pub fn table_footer(rows: &[Row]) -> String {
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    let verdict = if wrong == 0 { "OK" } else { "FAILED" };
    let avg = if rows.is_empty() {
        0.0
    } else {
        rows.iter().map(|r| r.busbw).sum::<f64>() / rows.len() as f64
    };
    format!("# Out of bounds values : {wrong} {verdict}\n# Avg bus bandwidth    : {avg:.3}")
}

/// The rows as a pretty JSON array (what `--json FILE` writes).
pub fn to_json(rows: &[Row]) -> String {
    // Serializing plain structs of numbers and strings cannot fail.
    serde_json::to_string_pretty(rows).unwrap_or_else(|e| format!("\"{e}\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::{DataType, ReduceOp};

    fn info() -> RunInfo {
        RunInfo {
            mode: Mode::Direct,
            backend: "threads".into(),
            tensors: 1,
        }
    }

    fn spec(op: BenchOp, bytes: usize, ranks: usize) -> Spec {
        Spec {
            op,
            dtype: DataType::F32,
            redop: ReduceOp::Sum,
            layout: op.layout(bytes, 4, ranks),
            ranks,
        }
    }

    #[test]
    fn bandwidths_follow_the_factors() {
        // 16 MiB in 1000 us = 16.777 GB/s.
        let summary = Summary {
            time_us: 1000.0,
            wrong: Some(0),
        };
        let ar = Row::new(&info(), &spec(BenchOp::Allreduce, 16 << 20, 4), summary);
        assert!((ar.algbw - 16.777216).abs() < 1e-9);
        assert!((ar.busbw - 16.777216 * 1.5).abs() < 1e-9);
        let ag = Row::new(&info(), &spec(BenchOp::Allgather, 16 << 20, 4), summary);
        assert!((ag.busbw - 16.777216 * 0.75).abs() < 1e-9);
        assert_eq!(ag.redop, "none");
        let zero = Row::new(
            &info(),
            &spec(BenchOp::Sendrecv, 8, 2),
            Summary {
                time_us: 0.0,
                wrong: None,
            },
        );
        assert_eq!((zero.algbw, zero.busbw), (0.0, 0.0));
    }

    #[test]
    fn json_row_format() {
        let row = Row::new(
            &info(),
            &spec(BenchOp::Reducescatter, 64, 2),
            Summary {
                time_us: 2.0,
                wrong: Some(0),
            },
        );
        let value: serde_json::Value =
            serde_json::from_str(&to_json(std::slice::from_ref(&row))).unwrap();
        let obj = &value[0];
        assert_eq!(obj["op"], "reducescatter");
        assert_eq!(obj["mode"], "direct");
        assert_eq!(obj["backend"], "threads");
        assert_eq!(obj["ranks"], 2);
        assert_eq!(obj["size"], 64);
        assert_eq!(obj["count"], 16);
        assert_eq!(obj["type"], "f32");
        assert_eq!(obj["redop"], "sum");
        assert_eq!(obj["time_us"], 2.0);
        assert_eq!(obj["algbw"], 0.032);
        assert_eq!(obj["wrong"], 0);
        let back: Vec<Row> = serde_json::from_value(value).unwrap();
        assert_eq!(back, vec![row]);
        let unchecked = Row {
            wrong: None,
            ..back[0].clone()
        };
        assert!(to_json(&[unchecked]).contains("\"wrong\": null"));
    }

    #[test]
    fn table_lines_align_with_the_header() {
        let row = Row::new(
            &info(),
            &spec(BenchOp::Allreduce, 1 << 20, 2),
            Summary {
                time_us: 123.456,
                wrong: None,
            },
        );
        let line = table_line(&row);
        let header = table_header();
        let names = header.lines().next().unwrap();
        assert_eq!(line.len(), names.len());
        assert!(line.contains("1048576") && line.contains("123.46") && line.ends_with("N/A"));
        let footer = table_footer(&[
            row.clone(),
            Row {
                wrong: Some(3),
                ..row
            },
        ]);
        assert!(footer.contains("3 FAILED"), "{footer}");
        assert!(table_title(BenchOp::Allreduce, &info(), 2)
            .contains("allreduce: threads backend, 2 ranks"));
        let baseline = RunInfo {
            mode: Mode::Baseline,
            backend: "mpi".into(),
            tensors: 1,
        };
        assert!(table_title(BenchOp::Allreduce, &baseline, 4).contains("plain MPI_Allreduce"));
    }
}
