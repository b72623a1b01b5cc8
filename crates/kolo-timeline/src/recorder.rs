//! Turns [`Event`]s into trace records, keeping every row well nested.
//!
//! The recorder owns the pid table and, per row, the stack of open spans.
//! An end that has nothing to close is dropped rather than written, an
//! operation's end first closes the activities still open inside it, and
//! timestamps on a row never go backwards; so whatever order the engine
//! calls the timeline in, every row of the file stays balanced and properly
//! nested, as the viewers need. A clean close leaves spans that are still
//! open as they are (the viewers draw them to the end of the trace).

use crate::event::{Action, Event};
use crate::pid_table::PidTable;
use crate::record::{write_line, Args, Phase, Scope, TraceRecord};

/// The name of the global instant event that marks a cycle.
pub(crate) const CYCLE_START: &str = "CYCLE_START";
/// The prefix of the negotiation span's name (`NEGOTIATE_ALLREDUCE`).
pub(crate) const NEGOTIATE_PREFIX: &str = "NEGOTIATE_";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpanKind {
    Negotiation,
    Op,
    Activity,
}

#[derive(Debug)]
struct OpenSpan {
    name: String,
    kind: SpanKind,
}

#[derive(Debug, Default)]
struct Row {
    open: Vec<OpenSpan>,
    last_ts_ns: u64,
}

/// The writer thread's state: pids and open spans of every row.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    pids: PidTable,
    /// Indexed by `pid - FIRST_TENSOR_PID`.
    rows: Vec<Row>,
}

impl Recorder {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Appends the lines `event` stands for to `out` (possibly none).
    pub(crate) fn record(
        &mut self,
        event: &Event,
        out: &mut Vec<u8>,
    ) -> Result<(), serde_json::Error> {
        match event {
            Event::CycleStart { ts_ns } => {
                let mut record = TraceRecord::at(CYCLE_START, Phase::Instant, *ts_ns, 0);
                record.s = Some(Scope::Global);
                write_line(&record, out)
            }
            Event::Tensor {
                ts_ns,
                tensor,
                action,
            } => self.record_tensor(*ts_ns, tensor, action, out),
        }
    }

    fn record_tensor(
        &mut self,
        ts_ns: u64,
        tensor: &str,
        action: &Action,
        out: &mut Vec<u8>,
    ) -> Result<(), serde_json::Error> {
        let (pid, new) = self.pids.pid_of(tensor);
        if new {
            write_line(
                &TraceRecord::metadata("process_name", pid, Args::ProcessName { name: tensor }),
                out,
            )?;
            write_line(
                &TraceRecord::metadata(
                    "process_sort_index",
                    pid,
                    Args::SortIndex { sort_index: pid },
                ),
                out,
            )?;
        }
        let index = (pid - crate::pid_table::FIRST_TENSOR_PID) as usize;
        if self.rows.len() <= index {
            self.rows.resize_with(index + 1, Row::default);
        }
        let Some(row) = self.rows.get_mut(index) else {
            return Ok(());
        };
        let ts_ns = ts_ns.max(row.last_ts_ns);
        row.last_ts_ns = ts_ns;
        match action {
            Action::NegotiateStart { kind } => row.begin(
                format!("{NEGOTIATE_PREFIX}{kind}"),
                SpanKind::Negotiation,
                ts_ns,
                pid,
                out,
            ),
            Action::RankReady { rank } => {
                let name = rank.to_string();
                let mut record = TraceRecord::at(&name, Phase::Instant, ts_ns, pid);
                record.s = Some(Scope::Thread);
                write_line(&record, out)
            }
            Action::NegotiateEnd => row.end_through(SpanKind::Negotiation, None, ts_ns, pid, out),
            Action::OpStart { op } => row.begin(op.clone(), SpanKind::Op, ts_ns, pid, out),
            Action::OpEnd { dtype, shape } => row.end_through(
                SpanKind::Op,
                Some(Args::OpEnd { dtype, shape }),
                ts_ns,
                pid,
                out,
            ),
            Action::ActivityStart { activity } => {
                row.begin(activity.clone(), SpanKind::Activity, ts_ns, pid, out)
            }
            Action::ActivityEnd => {
                if row
                    .open
                    .last()
                    .is_some_and(|span| span.kind == SpanKind::Activity)
                {
                    row.end_top(None, ts_ns, pid, out)?;
                }
                Ok(())
            }
        }
    }
}

impl Row {
    fn begin(
        &mut self,
        name: String,
        kind: SpanKind,
        ts_ns: u64,
        pid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), serde_json::Error> {
        write_line(&TraceRecord::at(&name, Phase::Begin, ts_ns, pid), out)?;
        self.open.push(OpenSpan { name, kind });
        Ok(())
    }

    /// Closes the innermost open span of `kind` and everything opened
    /// inside it; `args` go on the span's own end. Nothing if none is open.
    fn end_through(
        &mut self,
        kind: SpanKind,
        args: Option<Args<'_>>,
        ts_ns: u64,
        pid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), serde_json::Error> {
        let Some(position) = self.open.iter().rposition(|span| span.kind == kind) else {
            return Ok(());
        };
        while self.open.len() > position + 1 {
            self.end_top(None, ts_ns, pid, out)?;
        }
        self.end_top(args, ts_ns, pid, out)
    }

    fn end_top(
        &mut self,
        args: Option<Args<'_>>,
        ts_ns: u64,
        pid: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), serde_json::Error> {
        let Some(span) = self.open.pop() else {
            return Ok(());
        };
        // Viewers ignore an end's name; it is written for people and tests.
        let mut record = TraceRecord::at(&span.name, Phase::End, ts_ns, pid);
        record.args = args;
        write_line(&record, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;
    use std::collections::HashMap;

    fn tensor(ts_ns: u64, tensor: &str, action: Action) -> Event {
        Event::Tensor {
            ts_ns,
            tensor: tensor.to_owned(),
            action,
        }
    }

    fn run(events: &[Event]) -> Vec<Value> {
        let mut recorder = Recorder::new();
        let mut out = Vec::new();
        for event in events {
            recorder.record(event, &mut out).unwrap();
        }
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line.strip_suffix(',').unwrap()).unwrap())
            .collect()
    }

    /// Per pid: every E closes the B on top of the stack (same name, no
    /// earlier ts). Returns the spans left open per pid.
    fn check_nesting(records: &[Value]) -> HashMap<u64, Vec<String>> {
        let mut stacks: HashMap<u64, Vec<(String, f64)>> = HashMap::new();
        for record in records {
            let pid = record["pid"].as_u64().unwrap();
            let name = record["name"].as_str().unwrap().to_owned();
            let ts = record["ts"].as_f64();
            match record["ph"].as_str().unwrap() {
                "B" => stacks.entry(pid).or_default().push((name, ts.unwrap())),
                "E" => {
                    let (open, begin_ts) =
                        stacks.entry(pid).or_default().pop().expect("E without B");
                    assert_eq!(open, name);
                    assert!(ts.unwrap() >= begin_ts);
                }
                _ => {}
            }
        }
        stacks
            .into_iter()
            .map(|(pid, open)| (pid, open.into_iter().map(|(name, _)| name).collect()))
            .collect()
    }

    #[test]
    fn first_event_of_a_tensor_names_its_row() {
        let records = run(&[tensor(
            5,
            "a",
            Action::OpStart {
                op: "ALLREDUCE".into(),
            },
        )]);
        assert_eq!(records.len(), 3);
        assert_eq!(records[0]["name"], "process_name");
        assert_eq!(records[0]["args"]["name"], "a");
        assert_eq!(records[1]["name"], "process_sort_index");
        assert_eq!(records[2]["ph"], "B");
        assert_eq!(records[2]["pid"], 1);
    }

    #[test]
    fn op_end_closes_open_activities_then_the_op_with_args() {
        let records = run(&[
            tensor(
                1,
                "a",
                Action::OpStart {
                    op: "ALLREDUCE".into(),
                },
            ),
            tensor(
                2,
                "a",
                Action::ActivityStart {
                    activity: "QUEUE".into(),
                },
            ),
            tensor(
                3,
                "a",
                Action::ActivityStart {
                    activity: "INNER".into(),
                },
            ),
            tensor(
                4,
                "a",
                Action::OpEnd {
                    dtype: "f32".into(),
                    shape: vec![4],
                },
            ),
        ]);
        let ends: Vec<_> = records.iter().filter(|r| r["ph"] == "E").collect();
        let names: Vec<_> = ends.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["INNER", "QUEUE", "ALLREDUCE"]);
        assert!(ends[0].get("args").is_none());
        assert_eq!(ends[2]["args"]["dtype"], "f32");
        assert!(check_nesting(&records).values().all(Vec::is_empty));
    }

    #[test]
    fn ends_with_nothing_to_close_are_dropped() {
        let records = run(&[
            tensor(1, "a", Action::ActivityEnd),
            tensor(2, "a", Action::NegotiateEnd),
            tensor(
                3,
                "a",
                Action::OpEnd {
                    dtype: "f32".into(),
                    shape: vec![],
                },
            ),
            tensor(
                4,
                "a",
                Action::OpStart {
                    op: "ALLREDUCE".into(),
                },
            ),
            // The op, not an activity, is on top: this end is not the op's.
            tensor(5, "a", Action::ActivityEnd),
        ]);
        assert!(records.iter().all(|r| r["ph"] != "E"));
        assert_eq!(check_nesting(&records)[&1], ["ALLREDUCE"]);
    }

    #[test]
    fn timestamps_on_a_row_never_go_backwards_and_rows_are_separate() {
        let records = run(&[
            tensor(
                10_000,
                "a",
                Action::NegotiateStart {
                    kind: "ALLREDUCE".into(),
                },
            ),
            tensor(4_000, "a", Action::RankReady { rank: 1 }),
            tensor(
                2_000,
                "b",
                Action::NegotiateStart {
                    kind: "BROADCAST".into(),
                },
            ),
            tensor(3_000, "a", Action::NegotiateEnd),
            Event::CycleStart { ts_ns: 1_000 },
        ]);
        let timed: Vec<_> = records.iter().filter(|r| r["ph"] != "M").collect();
        let ts: Vec<_> = timed.iter().map(|r| r["ts"].as_f64().unwrap()).collect();
        assert_eq!(ts, [10.0, 10.0, 2.0, 10.0, 1.0]);
        assert_eq!(timed[0]["name"], "NEGOTIATE_ALLREDUCE");
        assert_eq!(
            (timed[1]["name"].as_str(), timed[1]["s"].as_str()),
            (Some("1"), Some("t"))
        );
        assert_eq!(
            (timed[2]["name"].as_str(), timed[2]["pid"].as_u64()),
            (Some("NEGOTIATE_BROADCAST"), Some(2))
        );
        assert_eq!(
            (timed[4]["name"].as_str(), timed[4]["s"].as_str()),
            (Some(CYCLE_START), Some("g"))
        );
    }

    fn any_action() -> impl Strategy<Value = Action> {
        prop_oneof![
            "[A-Z]{1,4}".prop_map(|kind| Action::NegotiateStart { kind }),
            (0u32..8).prop_map(|rank| Action::RankReady { rank }),
            Just(Action::NegotiateEnd),
            "[A-Z]{1,4}".prop_map(|op| Action::OpStart { op }),
            proptest::collection::vec(0u64..9, 0..3).prop_map(|shape| Action::OpEnd {
                dtype: "f16".into(),
                shape
            }),
            "[A-Z]{1,4}".prop_map(|activity| Action::ActivityStart { activity }),
            Just(Action::ActivityEnd),
        ]
    }

    proptest! {
        /// Any call order, even a nonsensical one, yields properly nested rows.
        #[test]
        fn any_call_sequence_stays_nested(calls in proptest::collection::vec((0usize..3, 0u64..1_000, any_action()), 0..80)) {
            let names = ["a", "b\"", "c/d"];
            let events: Vec<_> = calls.into_iter().map(|(t, ts, action)| tensor(ts, names[t], action)).collect();
            let records = run(&events);
            check_nesting(&records);
            let named = records.iter().filter(|r| r["name"] == "process_name").count();
            let rows: std::collections::HashSet<_> = records.iter().map(|r| r["pid"].as_u64().unwrap()).collect();
            prop_assert_eq!(named, rows.len());
        }
    }
}
