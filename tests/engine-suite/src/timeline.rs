//! The timeline rank 0 writes: negotiation with a ready tick per rank,
//! the fused operation's activities, each operation's end with dtype and
//! shape, and cycle marks.

use crate::Digest;
use kolo::{Error, Kolo, ReduceOp, TensorGroup, TensorMut};
use serde_json::Value;
use std::path::Path;

/// Operations that [`verify`] then finds in rank 0's timeline: a fused
/// group of three and an uneven allgather.
pub fn operations(kolo: &Kolo) -> Result<Digest, Error> {
    let r = kolo.rank();
    let mut a = vec![1.0f32; 6];
    let mut b = vec![2.0f32; 3];
    let mut c = vec![3.0f32; 5];
    let group = TensorGroup::new(["timeline/a", "timeline/b", "timeline/c"])?;
    kolo.scope(|s| {
        let views = [
            TensorMut::with_shape(&mut a, [2, 3]),
            TensorMut::from(&mut b),
            TensorMut::from(&mut c),
        ];
        s.allreduce_group_async(&group, views, ReduceOp::Sum)?
            .wait()
    })?;
    assert_eq!(a, vec![kolo.size() as f32; 6]);
    let gathered = kolo.allgather("timeline/gathered", &vec![r as i32; r + 1])?;
    assert_eq!(gathered.len(), kolo.size() * (kolo.size() + 1) / 2);
    Ok(None)
}

/// Parses the trace, an unterminated JSON array (tolerating a closed one).
fn parse(text: &str) -> Result<Vec<Value>, String> {
    let body = text
        .trim()
        .trim_end_matches(']')
        .trim_end()
        .trim_end_matches(',');
    serde_json::from_str(&format!("{body}]"))
        .map_err(|e| format!("the timeline is not a JSON array of records: {e}"))
}

/// The row (`pid`) of `tensor`.
fn row_of(records: &[Value], tensor: &str) -> Result<Value, String> {
    records
        .iter()
        .find(|r| r["ph"] == "M" && r["args"]["name"] == tensor)
        .map(|r| r["pid"].clone())
        .ok_or_else(|| format!("no row for {tensor}"))
}

fn has(records: &[Value], pid: &Value, ph: &str, name: &str) -> bool {
    records
        .iter()
        .any(|r| &r["pid"] == pid && r["ph"] == ph && r["name"] == name)
}

/// The end record of the operation on row `pid` (it carries the dtype).
fn end_of<'a>(records: &'a [Value], pid: &Value) -> Result<&'a Value, String> {
    records
        .iter()
        .find(|r| &r["pid"] == pid && r["ph"] == "E" && r["args"]["dtype"].is_string())
        .ok_or_else(|| format!("no end with a dtype on row {pid}"))
}

fn expect(cond: bool, what: &str) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what.to_owned())
    }
}

/// Why the file at `path` lacks the events [`operations`] must have left in
/// a job of `np` ranks (with cycle marks), if it does. `packs`: whether the
/// backend packs a fused allreduce into the fusion buffer (MPI), so that
/// its row must also show the two `MEMCPY_*_FUSION_BUFFER` activities; a
/// backend that reduces the tensors in place (kolo-threads) has none.
pub fn verify(path: &Path, np: usize, packs: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let records = parse(&text)?;
    let a = row_of(&records, "timeline/a")?;
    expect(
        has(&records, &a, "B", "NEGOTIATE_ALLREDUCE"),
        "no negotiation span on timeline/a",
    )?;
    for rank in 0..np {
        expect(
            has(&records, &a, "i", &rank.to_string()),
            &format!("no ready tick of rank {rank} on timeline/a"),
        )?;
    }
    let copies: &[&str] = if packs {
        &["MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"]
    } else {
        &[]
    };
    for &activity in ["ALLREDUCE", "QUEUE"].iter().chain(copies) {
        expect(
            has(&records, &a, "B", activity),
            &format!("no {activity} on timeline/a's row"),
        )?;
    }
    let end = end_of(&records, &a)?;
    expect(
        end["args"]["dtype"] == "f32" && end["args"]["shape"] == serde_json::json!([2, 3]),
        &format!("timeline/a ends with {end}, not f32 [2, 3]"),
    )?;
    let g = row_of(&records, "timeline/gathered")?;
    expect(
        has(&records, &g, "B", "NEGOTIATE_ALLGATHER"),
        "no negotiation span on timeline/gathered",
    )?;
    let end = end_of(&records, &g)?;
    let rows = np * (np + 1) / 2;
    expect(
        end["args"]["dtype"] == "i32" && end["args"]["shape"] == serde_json::json!([rows]),
        &format!("timeline/gathered ends with {end}, not i32 [{rows}]"),
    )?;
    expect(
        records.iter().any(|r| r["name"] == "CYCLE_START"),
        "no cycle marks",
    )
}
