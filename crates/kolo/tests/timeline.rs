//! The timeline rank 0 writes: negotiation with ready ticks, the
//! operation's activities, and its end with dtype and shape.

mod common;

use common::config;
use kolo::{ReduceOp, TensorMut};
use serde_json::Value;

/// Parses the trace, an unterminated JSON array (tolerating a closed one).
fn parse(text: &str) -> Vec<Value> {
    let body = text
        .trim()
        .trim_end_matches(']')
        .trim_end()
        .trim_end_matches(',');
    serde_json::from_str(&format!("{body}]")).expect("the timeline is a JSON array of records")
}

/// The row (`pid`) of `tensor`.
fn row_of(records: &[Value], tensor: &str) -> Value {
    records
        .iter()
        .find(|r| r["ph"] == "M" && r["args"]["name"] == tensor)
        .map(|r| r["pid"].clone())
        .unwrap_or_else(|| panic!("no row for {tensor}"))
}

fn has(records: &[Value], pid: &Value, ph: &str, name: &str) -> bool {
    records
        .iter()
        .any(|r| &r["pid"] == pid && r["ph"] == ph && r["name"] == name)
}

#[test]
fn the_timeline_records_negotiation_activities_and_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.json");
    kolo::threads::run(
        2,
        config().timeline(&path).timeline_mark_cycles(true),
        |kolo| {
            let r = kolo.rank();
            let mut a = vec![1.0f32; 6];
            let mut b = vec![2.0f32; 3];
            let mut c = vec![3.0f32; 5];
            kolo.grouped_allreduce_async(
                [
                    ("fused/a", TensorMut::with_shape(&mut a, [2, 3])),
                    ("fused/b", TensorMut::from(&mut b)),
                    ("fused/c", TensorMut::from(&mut c)),
                ],
                ReduceOp::Sum,
            )?
            .wait()?;
            assert_eq!(a, vec![2.0; 6]);
            let gathered = kolo.allgather("gathered", &vec![r as i32; r + 1])?;
            assert_eq!(gathered, [0, 1, 1]);
            Ok(())
        },
    )
    .unwrap();

    let records = parse(&std::fs::read_to_string(&path).unwrap());
    let a = row_of(&records, "fused/a");
    assert!(
        has(&records, &a, "B", "NEGOTIATE_ALLREDUCE"),
        "negotiation span"
    );
    assert!(
        has(&records, &a, "i", "0") && has(&records, &a, "i", "1"),
        "a ready tick per rank"
    );
    for activity in [
        "ALLREDUCE",
        "QUEUE",
        "MEMCPY_IN_FUSION_BUFFER",
        "MEMCPY_OUT_FUSION_BUFFER",
    ] {
        assert!(
            has(&records, &a, "B", activity),
            "{activity} on the fused tensor's row"
        );
    }
    let end = records
        .iter()
        .find(|r| r["pid"] == a && r["ph"] == "E" && r["args"]["dtype"].is_string())
        .expect("the operation's end carries its dtype");
    assert_eq!(end["args"]["dtype"], "f32");
    assert_eq!(end["args"]["shape"], serde_json::json!([2, 3]));

    let g = row_of(&records, "gathered");
    assert!(has(&records, &g, "B", "NEGOTIATE_ALLGATHER"));
    let end = records
        .iter()
        .find(|r| r["pid"] == g && r["ph"] == "E" && r["args"]["dtype"].is_string())
        .expect("the allgather's end");
    assert_eq!(end["args"]["dtype"], "i32");
    assert_eq!(end["args"]["shape"], serde_json::json!([3]));

    assert!(
        records.iter().any(|r| r["name"] == "CYCLE_START"),
        "cycles are marked"
    );
}

#[test]
fn a_timeline_that_cannot_be_created_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-dir").join("t.json");
    let err = kolo::threads::run(2, config().timeline(&path), |_| Ok(())).unwrap_err();
    assert!(
        matches!(&err, kolo::Error::Timeline { path: p, .. } if p == &path),
        "{err:?}"
    );
}
