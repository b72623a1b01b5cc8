//! One trace-event record and its JSON line.
//!
//! The format is Chrome's trace-event format as Perfetto and
//! chrome://tracing read it: `ph` is the phase (`B` begin, `E` end, `i`
//! instant, `M` metadata), `ts` is in microseconds, `pid` selects the row.

use serde::Serialize;

/// The phase of a record (`ph`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Phase {
    /// A span begins.
    #[serde(rename = "B")]
    Begin,
    /// The innermost open span of the row ends.
    #[serde(rename = "E")]
    End,
    /// A point in time.
    #[serde(rename = "i")]
    Instant,
    /// Metadata (row names and order).
    #[serde(rename = "M")]
    Metadata,
}

/// The scope of an instant event (`s`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Scope {
    /// Drawn on its own row.
    #[serde(rename = "t")]
    Thread,
    /// Drawn across every row.
    #[serde(rename = "g")]
    Global,
}

/// The `args` of a record.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub(crate) enum Args<'a> {
    /// `process_name` metadata: the row's title.
    ProcessName { name: &'a str },
    /// `process_sort_index` metadata: the row's place.
    SortIndex { sort_index: u32 },
    /// The end of an operation: what it operated on.
    OpEnd { dtype: &'a str, shape: &'a [u64] },
}

/// One trace event, borrowed from the recorder's state.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct TraceRecord<'a> {
    pub name: &'a str,
    pub ph: Phase,
    /// Microseconds since the timeline was created; absent on metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ts: Option<f64>,
    pub pid: u32,
    pub tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s: Option<Scope>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Args<'a>>,
}

impl<'a> TraceRecord<'a> {
    /// A record at `ts_ns` nanoseconds on row `pid`, with no scope or args.
    pub(crate) fn at(name: &'a str, ph: Phase, ts_ns: u64, pid: u32) -> Self {
        TraceRecord {
            name,
            ph,
            ts: Some(micros(ts_ns)),
            pid,
            tid: 0,
            s: None,
            args: None,
        }
    }

    /// A metadata record for row `pid`.
    pub(crate) fn metadata(name: &'a str, pid: u32, args: Args<'a>) -> Self {
        TraceRecord {
            name,
            ph: Phase::Metadata,
            ts: None,
            pid,
            tid: 0,
            s: None,
            args: Some(args),
        }
    }
}

/// Nanoseconds as the fractional microseconds `ts` is given in (exact up to
/// about 104 days).
pub(crate) fn micros(ts_ns: u64) -> f64 {
    ts_ns as f64 / 1000.0
}

/// Appends `record` to `out` as one line: the JSON object, then `,\n`.
/// Names are escaped by serde_json, so any tensor name is safe.
pub(crate) fn write_line(
    record: &TraceRecord<'_>,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    serde_json::to_writer(&mut *out, record)?;
    out.extend_from_slice(b",\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn parsed(record: &TraceRecord<'_>) -> Value {
        let mut out = Vec::new();
        write_line(record, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let body = text.strip_suffix(",\n").expect("line ends with `,\\n`");
        assert!(!body.contains('\n'), "one record, one line: {body}");
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn begin_record_has_phase_ts_and_row() {
        let v = parsed(&TraceRecord::at("ALLREDUCE", Phase::Begin, 1_500, 3));
        assert_eq!(
            v,
            json!({"name": "ALLREDUCE", "ph": "B", "ts": 1.5, "pid": 3, "tid": 0})
        );
    }

    #[test]
    fn op_end_carries_dtype_and_shape() {
        let mut record = TraceRecord::at("ALLREDUCE", Phase::End, 2_000, 1);
        record.args = Some(Args::OpEnd {
            dtype: "float32",
            shape: &[2, 3],
        });
        let v = parsed(&record);
        assert_eq!(v["ph"], "E");
        assert_eq!(v["args"], json!({"dtype": "float32", "shape": [2, 3]}));
    }

    #[test]
    fn metadata_has_no_ts_and_global_instant_has_scope() {
        let v = parsed(&TraceRecord::metadata(
            "process_name",
            7,
            Args::ProcessName { name: "w" },
        ));
        assert_eq!(
            v,
            json!({"name": "process_name", "ph": "M", "pid": 7, "tid": 0, "args": {"name": "w"}})
        );
        let v = parsed(&TraceRecord::metadata(
            "process_sort_index",
            7,
            Args::SortIndex { sort_index: 7 },
        ));
        assert_eq!(v["args"], json!({"sort_index": 7}));
        let mut cycle = TraceRecord::at("CYCLE_START", Phase::Instant, 0, 0);
        cycle.s = Some(Scope::Global);
        assert_eq!(parsed(&cycle)["s"], "g");
    }

    #[test]
    fn awkward_names_are_escaped() {
        let name = "grad/\"w\"\n\\\u{1}é🦀";
        let v = parsed(&TraceRecord::metadata(
            "process_name",
            1,
            Args::ProcessName { name },
        ));
        assert_eq!(v["args"]["name"], name);
    }
}
