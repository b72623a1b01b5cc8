//! Reads a trace file back and checks what the viewers need.

#![allow(dead_code)] // each test file uses a different part

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

/// A closed span on one row.
#[derive(Debug, Clone)]
pub struct Span {
    pub pid: u64,
    pub name: String,
    /// The span it is nested in, on the same row.
    pub parent: Option<String>,
    pub begin_ts: f64,
    pub end_ts: f64,
    pub end_args: Option<Value>,
}

/// An instant event.
#[derive(Debug, Clone)]
pub struct Tick {
    pub pid: u64,
    pub name: String,
    pub scope: String,
    /// The innermost span open on the row when it happened.
    pub inside: Option<String>,
}

/// A trace whose rows are balanced, properly nested and named.
#[derive(Debug, Default)]
pub struct Checked {
    /// pid -> tensor name.
    pub rows: HashMap<u64, String>,
    pub spans: Vec<Span>,
    pub ticks: Vec<Tick>,
    /// Spans never closed, per pid (innermost last).
    pub open: HashMap<u64, Vec<String>>,
}

impl Checked {
    pub fn pid(&self, tensor: &str) -> u64 {
        let pids: Vec<_> = self
            .rows
            .iter()
            .filter(|(_, name)| *name == tensor)
            .map(|(pid, _)| *pid)
            .collect();
        assert_eq!(pids.len(), 1, "one row for {tensor:?}, got {pids:?}");
        pids[0]
    }

    pub fn spans_of(&self, tensor: &str) -> Vec<&Span> {
        let pid = self.pid(tensor);
        self.spans.iter().filter(|span| span.pid == pid).collect()
    }

    pub fn ticks_of(&self, tensor: &str) -> Vec<&Tick> {
        let pid = self.pid(tensor);
        self.ticks.iter().filter(|tick| tick.pid == pid).collect()
    }

    pub fn all_closed(&self) -> bool {
        self.open.values().all(Vec::is_empty)
    }
}

pub fn read(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("trace file readable");
    assert!(text.starts_with('['), "trace starts with `[`");
    kolo_timeline::parse_trace(&text).expect("trace parses as a viewer parses it")
}

/// Panics unless every row's B/E pair up innermost first (same name, end not
/// before begin) and every row is named before its first event.
pub fn check(records: &[Value]) -> Checked {
    let mut checked = Checked::default();
    let mut stacks: HashMap<u64, Vec<(String, f64)>> = HashMap::new();
    for record in records {
        let ph = record["ph"].as_str().expect("ph");
        let name = record["name"].as_str().expect("name").to_owned();
        let pid = record["pid"].as_u64().expect("pid");
        let scope = record["s"].as_str().unwrap_or("t").to_owned();
        if ph == "M" {
            if name == "process_name" {
                let tensor = record["args"]["name"]
                    .as_str()
                    .expect("args.name")
                    .to_owned();
                assert!(
                    checked.rows.insert(pid, tensor).is_none(),
                    "pid {pid} named twice"
                );
            }
            continue;
        }
        let ts = record["ts"].as_f64().expect("ts");
        assert!(ts >= 0.0);
        if ph == "i" && scope == "g" {
            checked.ticks.push(Tick {
                pid,
                name,
                scope,
                inside: None,
            });
            continue;
        }
        assert!(
            checked.rows.contains_key(&pid),
            "pid {pid} used before its process_name"
        );
        let stack = stacks.entry(pid).or_default();
        match ph {
            "B" => stack.push((name, ts)),
            "E" => {
                let (open, begin_ts) = stack
                    .pop()
                    .unwrap_or_else(|| panic!("E {name:?} on pid {pid} closes nothing"));
                assert_eq!(open, name, "pid {pid}: E closes the innermost B");
                assert!(ts >= begin_ts, "pid {pid}: {name} ends before it begins");
                let parent = stack.last().map(|(parent, _)| parent.clone());
                let end_args = record.get("args").cloned();
                checked.spans.push(Span {
                    pid,
                    name,
                    parent,
                    begin_ts,
                    end_ts: ts,
                    end_args,
                });
            }
            "i" => {
                let inside = stack.last().map(|(span, _)| span.clone());
                checked.ticks.push(Tick {
                    pid,
                    name,
                    scope,
                    inside,
                });
            }
            other => panic!("unexpected phase {other:?}"),
        }
    }
    checked.open = stacks
        .into_iter()
        .map(|(pid, stack)| (pid, stack.into_iter().map(|(name, _)| name).collect()))
        .collect();
    checked
}
