//! The cases every rank of a suite job runs in order, and the runner that
//! reports them: fusion, the response cache, thread levels, the timeline
//! and shutdown here; every op and the mismatch matrix in their modules.

use super::outcome::{CASE, DIGEST};
use super::{mismatch, ops};
use kolo::{Error, Kolo, ReduceOp, Stats, TensorMut};
use kolo_mpi::ThreadLevel;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;

/// One case: runs on every rank, panics (assertions) or errs on failure.
pub type CaseFn = fn(&Kolo) -> Result<(), Error>;

/// Every case, in the order the ranks run them; `shutdown` must be last.
pub const CASES: &[(&str, CaseFn)] = &[
    ("allreduce_every_op", ops::allreduces),
    ("half_precision_and_bool", ops::half_precision_and_bool),
    ("allgather", ops::allgathers),
    ("broadcast", ops::broadcasts),
    ("reduce_scatter", ops::reduce_scatters),
    ("alltoall", ops::alltoalls),
    ("grouped_owned_and_barrier", ops::grouped_owned_and_barrier),
    ("several_user_threads", ops::several_user_threads),
    ("mismatch_matrix", mismatch::the_mismatch_matrix),
    ("fusion_equals_unfused", fusion_equals_unfused),
    ("cache_workload", cache_workload),
    ("thread_level", thread_level),
    ("timeline", timeline),
    (
        "shutdown_fails_pending_handles",
        shutdown_fails_pending_handles,
    ),
];

/// Runs every case on this rank. A failed case is printed, then the rank
/// aborts the job (`Kolo::abort` ends it with `MPI_Abort`), so peers that
/// wait on it do not hang.
pub fn run_all(kolo: &Kolo) -> ExitCode {
    let rank = kolo.rank();
    for (name, case) in CASES {
        let why = match catch_unwind(AssertUnwindSafe(|| case(kolo))) {
            Ok(Ok(())) => {
                report(&format!("{CASE} {name} {rank} ok"));
                continue;
            }
            Ok(Err(e)) => format!("error: {e}"),
            Err(panic) => format!("panic: {}", panic_text(panic.as_ref())),
        };
        report(&format!("{CASE} {name} {rank} FAILED {why}"));
        kolo.abort(&format!("rank {rank} failed case {name}: {why}"));
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// One line on stdout, flushed at once (the job may be aborted next).
fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The text of a panic's payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a non-string panic payload)".into())
}

/// A digest of values (FNV-1a over their bits), printed for the harness to
/// compare between jobs.
fn digest(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, v| {
        (h ^ v).wrapping_mul(0x100_0000_01b3)
    })
}

/// The counters that moved between two snapshots.
fn delta(before: &Stats, after: &Stats) -> (u64, u64, u64, u64) {
    (
        after.operations - before.operations,
        after.tensors - before.tensors,
        after.fused_operations - before.fused_operations,
        after.cache_hits - before.cache_hits,
    )
}

/// 48 small f32 tensors of integer values (so sums are exact whatever the
/// order): as one grouped allreduce (fused when fusion is on), then one at
/// a time (never fused). The results are equal and exact.
fn fusion_equals_unfused(kolo: &Kolo) -> Result<(), Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    let input = |t: usize| -> Vec<f32> {
        (0..1 + t * 5)
            .map(|i| ((r * 31 + t * 7 + i) % 97) as f32)
            .collect()
    };
    let expected = |t: usize| -> Vec<f32> {
        (0..1 + t * 5)
            .map(|i| (0..n).map(|q| ((q * 31 + t * 7 + i) % 97) as f32).sum())
            .collect()
    };
    let names: Vec<String> = (0..48).map(|t| format!("fuse/{t}")).collect();

    let before = kolo.stats();
    let mut fused: Vec<Vec<f32>> = (0..48).map(input).collect();
    let group = names
        .iter()
        .map(String::as_str)
        .zip(fused.iter_mut().map(|b| TensorMut::from(&mut b[..])));
    kolo.grouped_allreduce_async(group, ReduceOp::Sum)?.wait()?;
    let (ops, tensors, fused_ops, _) = delta(&before, &kolo.stats());
    assert_eq!(tensors, 48);
    if kolo.config().fusion_threshold > 0 {
        assert!(fused_ops > 0 && ops < 48, "{ops} ops, {fused_ops} fused");
    } else {
        assert_eq!((ops, fused_ops), (48, 0));
    }

    let before = kolo.stats();
    let mut single: Vec<Vec<f32>> = (0..48).map(input).collect();
    for (name, buf) in names.iter().zip(single.iter_mut()) {
        kolo.allreduce(name, buf, ReduceOp::Sum)?;
    }
    let (ops, _, fused_ops, _) = delta(&before, &kolo.stats());
    assert_eq!((ops, fused_ops), (48, 0), "one at a time never fuses");

    for (t, (a, b)) in fused.iter().zip(&single).enumerate() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "tensor {t}: fused differs from unfused");
        assert_eq!(a, &expected(t), "tensor {t}");
    }
    Ok(())
}

/// Four steps of a gradient-like workload (a group, async singles, an
/// allgather) on the same names: the cache settles repeated tensors when it
/// is on and never when off; every result is exact and goes into a digest
/// that the harness compares with the job that has the cache and fusion
/// off.
fn cache_workload(kolo: &Kolo) -> Result<(), Error> {
    let (r, n) = (kolo.rank() as i64, kolo.size() as i64);
    let before = kolo.stats();
    let mut results: Vec<u64> = Vec::new();
    for step in 0..4i64 {
        let sizes = [1usize, 7, 100, 33, 1000];
        let mut group: Vec<Vec<i64>> = sizes
            .iter()
            .map(|&len| (0..len as i64).map(|i| r * i + step).collect())
            .collect();
        let names: Vec<String> = (0..sizes.len()).map(|t| format!("grad/{t}")).collect();
        let mut views: Vec<(&str, &mut [i64])> = names
            .iter()
            .map(String::as_str)
            .zip(group.iter_mut().map(|b| &mut b[..]))
            .collect();
        kolo.grouped_allreduce(&mut views, ReduceOp::Sum)?;
        for (buf, &len) in group.iter().zip(&sizes) {
            let expected: Vec<i64> = (0..len as i64)
                .map(|i| i * n * (n - 1) / 2 + step * n)
                .collect();
            assert_eq!(buf, &expected, "step {step}");
        }
        let mut singles: Vec<Vec<i32>> = (0..4)
            .map(|t| vec![(r * t + step) as i32; 10 + t as usize])
            .collect();
        let handles = singles
            .iter_mut()
            .enumerate()
            .map(|(t, b)| kolo.allreduce_async(&format!("single/{t}"), b, ReduceOp::Max))
            .collect::<Result<Vec<_>, _>>()?;
        for h in handles {
            h.wait()?;
        }
        for (t, buf) in singles.iter().enumerate() {
            assert!(buf.iter().all(|&v| v as i64 == (n - 1) * t as i64 + step));
        }
        let gathered = kolo.allgather("gathered", &vec![step as u16; r as usize + 1])?;
        assert_eq!(gathered, vec![step as u16; (n * (n + 1) / 2) as usize]);
        results.extend(group.iter().flatten().map(|&v| v as u64));
        results.extend(singles.iter().flatten().map(|&v| v as u64));
        results.extend(gathered.iter().map(|&v| u64::from(v)));
    }
    let (_, _, fused_ops, hits) = delta(&before, &kolo.stats());
    let config = kolo.config();
    if config.cache_capacity > 0 {
        assert!(hits > 0, "repeated tensors hit the cache");
    } else {
        assert_eq!(hits, 0, "no cache, no hits");
    }
    if config.fusion_threshold == 0 {
        assert_eq!(fused_ops, 0, "no fusion");
    }
    report(&format!(
        "{DIGEST} cache_workload {} {:016x}",
        kolo.rank(),
        digest(results)
    ));
    Ok(())
}

/// `Kolo::mpi_threads_supported` reports what MPI granted, and
/// `KOLO_MPI_THREADS_DISABLE=1` asks for (and gets) no more than
/// `MPI_THREAD_FUNNELED`; the other cases ran at that level.
fn thread_level(kolo: &Kolo) -> Result<(), Error> {
    let granted = kolo_mpi::granted_thread_level().ok_or_else(|| Error::InvalidArgument {
        tensor: "thread level".into(),
        reason: "MPI reports no granted thread level although kolo initialised it".into(),
    })?;
    assert_eq!(
        Kolo::mpi_threads_supported(),
        Some(granted == ThreadLevel::Multiple),
        "granted {granted:?}"
    );
    if kolo.config().mpi_threads_disable {
        assert!(granted <= ThreadLevel::Funneled, "granted {granted:?}");
    }
    if kolo.rank() == 0 {
        report(&format!("# rank 0: MPI granted {granted:?}"));
    }
    Ok(())
}

/// Operations the harness then finds in rank 0's timeline (`timeline.rs`).
fn timeline(kolo: &Kolo) -> Result<(), Error> {
    let r = kolo.rank();
    let mut a = vec![1.0f32; 6];
    let mut b = vec![2.0f32; 3];
    let mut c = vec![3.0f32; 5];
    kolo.grouped_allreduce_async(
        [
            ("timeline/a", TensorMut::with_shape(&mut a, [2, 3])),
            ("timeline/b", TensorMut::from(&mut b)),
            ("timeline/c", TensorMut::from(&mut c)),
        ],
        ReduceOp::Sum,
    )?
    .wait()?;
    assert_eq!(a, vec![kolo.size() as f32; 6]);
    let gathered = kolo.allgather("timeline/gathered", &vec![r as i32; r + 1])?;
    assert_eq!(gathered.len(), kolo.size() * (kolo.size() + 1) / 2);
    Ok(())
}

/// Rank 0 shuts down while the others have an operation pending (that
/// rank 0 never submits): their handles fail with a shutdown naming rank
/// 0, later calls fail the same way, and every process then exits 0.
fn shutdown_fails_pending_handles(kolo: &Kolo) -> Result<(), Error> {
    let expected = Error::ShutDown { by_ranks: vec![0] };
    let mut x = [1i32; 4];
    if kolo.rank() == 0 {
        kolo.barrier()?;
        kolo.shutdown()?;
        kolo.shutdown()?; // idempotent
    } else {
        let pending = kolo.allreduce_async("pending", &mut x, ReduceOp::Sum)?;
        kolo.barrier()?;
        let err = pending.wait().expect_err("rank 0 never submits 'pending'");
        assert_eq!(err, expected);
        assert_eq!(
            err.to_string(),
            "kolo was shut down at the request of rank 0"
        );
    }
    assert!(kolo.is_shut_down());
    let later = kolo.allreduce("after", &mut x, ReduceOp::Sum);
    assert_eq!(later, Err(expected));
    Ok(())
}
