//! What the benchmark prints: human-readable rows, each also as one
//! `json: {...}` line that `run.sh` collects into `<step>.jsonl`. Rank 0
//! prints; every rank runs the measurements (they are collective).

use crate::latency::latency_breakdown;
use crate::ops::{latency, step, time_op, BenchOp, SIZES};
use kolo_nccl::NcclComm;
use kolo_transport::Topology;
use std::time::Duration;

/// One machine-readable row: `json: {...}`.
fn json_row(label: &str, ranks: usize, kind: &str, fields: &[(&str, f64)]) {
    let mut row = format!("json: {{\"label\":\"{label}\",\"ranks\":{ranks},\"kind\":\"{kind}\"");
    for (key, value) in fields {
        row.push_str(&format!(",\"{key}\":{value:.3}"));
    }
    println!("{row}}}");
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// nccl-tests-style table (when `tables`), the small-allreduce latency
/// and its breakdown, and the many-gradients step, printed by rank 0
/// (every rank runs them), each row also as a `json:` line.
pub fn print(comm: &mut NcclComm, label: &str, tables: bool) {
    let (rank, n) = (comm.rank(), comm.size());
    for op in BenchOp::ALL.into_iter().filter(|_| tables) {
        for bytes in SIZES {
            let iters = if bytes >= 1 << 30 { 10 } else { 20 };
            match time_op(comm, op, bytes, 5, iters) {
                Ok(r) if rank == 0 => {
                    println!(
                        "bench [{label}] {:>14} {:>10} B  {:>9.1} us  algbw {:>7.1} GB/s  busbw {:>7.1} GB/s",
                        op.name(),
                        r.bytes,
                        us(r.time),
                        r.algbw,
                        r.busbw
                    );
                    json_row(
                        label,
                        n,
                        op.name(),
                        &[
                            ("bytes", r.bytes as f64),
                            ("time_us", us(r.time)),
                            ("algbw_gbs", r.algbw),
                            ("busbw_gbs", r.busbw),
                        ],
                    );
                }
                Ok(_) => {}
                Err(e) => println!("rank {rank}: FAIL bench {} {bytes} B: {e}", op.name()),
            }
        }
    }
    match latency(comm, 8, 20, 200) {
        Ok(t) if rank == 0 => println!(
            "small: [{label}] 8 B allreduce median {:.1} us (call to completion, host clock)",
            us(t)
        ),
        Ok(_) => {}
        Err(e) => println!("rank {rank}: FAIL small allreduce: {e}"),
    }
    match latency_breakdown(comm, 8, 20, 200) {
        Ok(b) if rank == 0 => {
            println!(
                "small: [{label}] 8 B allreduce: host call {:.1} us; device per op back to back {:.1} us (event-tracked buffer {:.1} us, bare ncclAllReduce {:.1} us, bare + event record {:.1} us, bare + kolo tracking {:.1} us); nccl-tests-style loop (host clock, one sync) kolo {:.1} us, bare {:.1} us; call to completion {:.1} us",
                us(b.call),
                us(b.device),
                us(b.device_tracked),
                us(b.device_raw),
                us(b.device_raw_event),
                us(b.device_raw_tracked),
                us(b.loop_kolo),
                us(b.loop_raw),
                us(b.complete)
            );
            json_row(
                label,
                n,
                "small_allreduce",
                &[
                    ("bytes", b.bytes as f64),
                    ("call_us", us(b.call)),
                    ("device_us", us(b.device)),
                    ("device_tracked_us", us(b.device_tracked)),
                    ("device_raw_us", us(b.device_raw)),
                    ("device_raw_event_us", us(b.device_raw_event)),
                    ("device_raw_tracked_us", us(b.device_raw_tracked)),
                    ("loop_kolo_us", us(b.loop_kolo)),
                    ("loop_raw_us", us(b.loop_raw)),
                    ("complete_us", us(b.complete)),
                ],
            );
        }
        Ok(_) => {}
        Err(e) => println!("rank {rank}: FAIL small allreduce breakdown: {e}"),
    }
    match step(comm, 1000, 16 << 10, 3, 10) {
        Ok(s) if rank == 0 => {
            let ratio = s.fused.as_secs_f64() / s.single.as_secs_f64().max(1e-9);
            println!(
                "step: [{label}] {} x {} KiB fused (pack, one allreduce, unpack) {:.3} ms = {ratio:.2}x one allreduce of the same {} bytes ({:.3} ms); pack call {:.1} us, unpack call {:.1} us; event-tracked tensors {:.3} ms; separate allreduces {:.2} ms",
                s.tensors,
                s.tensor_bytes >> 10,
                s.fused.as_secs_f64() * 1e3,
                s.tensors * s.tensor_bytes,
                s.single.as_secs_f64() * 1e3,
                us(s.pack_call),
                us(s.unpack_call),
                s.fused_tracked.as_secs_f64() * 1e3,
                s.separate.as_secs_f64() * 1e3,
            );
            json_row(
                label,
                n,
                "step",
                &[
                    ("tensors", s.tensors as f64),
                    ("tensor_bytes", s.tensor_bytes as f64),
                    ("fused_us", us(s.fused)),
                    ("fused_tracked_us", us(s.fused_tracked)),
                    ("pack_call_us", us(s.pack_call)),
                    ("unpack_call_us", us(s.unpack_call)),
                    ("separate_us", us(s.separate)),
                    ("single_us", us(s.single)),
                    ("fused_over_single", ratio),
                ],
            );
        }
        Ok(_) => {}
        Err(e) => println!("rank {rank}: FAIL step: {e}"),
    }
}
