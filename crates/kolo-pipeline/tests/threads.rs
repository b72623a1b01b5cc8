//! kolo-pipeline over kolo-threads, with both engines: helper threads
//! with a two-rank communicator per channel (`pair_channels`) or a world
//! communicator per channel (`duplicate_channels`, as under MPI), and the
//! serial loop over each rank's world communicator.

mod common;
mod thread_channels;

use common::{
    expected_wide, finish_or_abort, run_stage, run_stage_wide, spec_for, totals, Observer, Report,
    TestError,
};
use kolo_pipeline::{
    duplicate_channels, run_serial, Direction, Options, Pipeline, PipelineError, PipelineSpec,
    StagePlan, Tensor,
};
use kolo_protocol::DataType;
use kolo_threads::{RunError, Topology};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use thread_channels::{thread_channels, world_channels};

const WIDTHS: [&[usize]; 4] = [&[1, 1], &[1, 2, 1], &[2, 3], &[1, 3, 2, 1]];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    /// Helper threads over `pair_channels`.
    Threaded,
    /// Helper threads over `duplicate_channels`.
    Duplicated,
    Serial,
}

const ENGINES: [Engine; 3] = [Engine::Threaded, Engine::Duplicated, Engine::Serial];

/// Runs `f` on every rank of `spec` with `engine`; the pipeline is
/// finished after `f` returns `Ok` and aborted with its error otherwise.
fn run<R: Send>(
    engine: Engine,
    spec: &PipelineSpec,
    options: Options,
    f: impl Fn(&Pipeline) -> Result<R, TestError> + Sync,
) -> Result<Vec<R>, RunError> {
    if engine == Engine::Serial {
        return kolo_threads::run(spec.world_size, |comm| {
            let plan = StagePlan::new(spec, comm.rank())?;
            run_serial(plan, options, comm, &f)
        });
    }
    let pairs = (engine == Engine::Threaded).then(|| thread_channels(spec, &options));
    let world = (engine == Engine::Duplicated).then(|| world_channels(spec, &options));
    kolo_threads::run(spec.world_size, |comm| {
        let rank = comm.rank();
        let plan = StagePlan::new(spec, rank)?;
        let channels = match (&pairs, &world) {
            (Some(sets), _) => sets[rank]
                .lock()
                .map_err(|_| TestError("poisoned".into()))?
                .take()
                .ok_or_else(|| TestError(format!("rank {rank}'s channels are gone")))?,
            (_, Some(world)) => duplicate_channels(&plan, &options, |key| world.take(key, rank))?,
            _ => return Err(TestError(format!("{engine:?} has no channels"))),
        };
        let pipe = Pipeline::start(plan, options, channels)?;
        finish_or_abort(pipe, &f)
    })
}

/// A tensor of [`run_stage`]'s shape and values.
fn expected(
    name: &str,
    dtype: DataType,
    g: u64,
    direction: Direction,
) -> Result<Tensor, kolo_pipeline::TensorError> {
    expected_wide(name, dtype, g, direction, 4)
}

fn check_totals(widths: &[usize], iterations: u64, forward_only: bool, reports: &[Report]) {
    let forward: u64 = reports.iter().map(|r| r.received_forward).sum();
    let backward: u64 = reports.iter().map(|r| r.received_backward).sum();
    assert_eq!(
        (forward, backward),
        totals(widths, iterations, forward_only),
        "{widths:?}, {iterations} minibatches"
    );
}

#[test]
fn every_minibatch_arrives_once_in_order_forward_and_backward() {
    for engine in ENGINES {
        for widths in WIDTHS {
            // 12 divides by every width; 7 by none but 1.
            for iterations in [12, 7] {
                let spec = spec_for(widths);
                let reports = run(engine, &spec, Options::training(iterations), |pipe| {
                    let report = run_stage(pipe, &())?;
                    pipe.wait()?;
                    assert_eq!(pipe.helpers_running(), 0);
                    Ok(report)
                })
                .unwrap_or_else(|e| panic!("{engine:?} {widths:?} {iterations}: {e}"));
                check_totals(widths, iterations, false, &reports);
            }
        }
    }
}

#[test]
fn large_tensors_cross_the_threaded_engine() {
    // 3 x 64 Ki f32 (768 KiB) per message at most.
    let spec = spec_for(&[1, 2, 1]);
    let reports = run(Engine::Threaded, &spec, Options::training(6), |pipe| {
        run_stage_wide(pipe, &(), 1 << 16)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    check_totals(&[1, 2, 1], 6, false, &reports);
}

/// Producers count their sends; a consumer checks, after each receive,
/// that its producer never had more than `window` messages unacknowledged.
struct InFlight {
    window: u64,
    sent: HashMap<(String, usize, usize), AtomicU64>,
    received: HashMap<(String, usize, usize), AtomicU64>,
    violations: Mutex<Vec<String>>,
}

impl InFlight {
    fn new(spec: &PipelineSpec, window: u64) -> Self {
        let mut sent = HashMap::new();
        let mut received = HashMap::new();
        for t in &spec.tensors {
            let (Some(p), Some(c)) = (t.producer, t.consumer) else {
                continue;
            };
            for &a in &spec.stages[p] {
                for &b in &spec.stages[c] {
                    sent.insert((t.name.clone(), a, b), AtomicU64::new(0));
                    received.insert((t.name.clone(), a, b), AtomicU64::new(0));
                }
            }
        }
        InFlight {
            window,
            sent,
            received,
            violations: Mutex::new(Vec::new()),
        }
    }
}

impl Observer for InFlight {
    fn sent(&self, plan: &StagePlan, name: &str, g: u64) {
        let route = plan.tensor(name).map(|t| t.consumer).unwrap_or(0);
        let to = plan.rank_for(route, g).unwrap_or(0);
        if let Some(count) = self.sent.get(&(name.to_string(), plan.rank(), to)) {
            count.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn received(&self, plan: &StagePlan, name: &str, g: u64) {
        let route = plan.tensor(name).map(|t| t.producer).unwrap_or(0);
        let from = plan.rank_for(route, g).unwrap_or(0);
        let key = (name.to_string(), from, plan.rank());
        let taken = self.received[&key].fetch_add(1, Ordering::SeqCst) + 1;
        let sent = self.sent[&key].load(Ordering::SeqCst);
        if sent > taken + self.window {
            self.violations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!(
                    "{name} {from}->{}: {sent} sent when {taken} were taken (window {})",
                    plan.rank(),
                    self.window
                ));
        }
    }
}

#[test]
fn forward_only_runs_ack_every_message_and_bound_the_window() {
    for engine in ENGINES {
        for widths in [&[1, 2, 1][..], &[2, 3], &[1, 1]] {
            for window in [1, 3] {
                let spec = spec_for(widths);
                let observer = InFlight::new(&spec, window);
                let options = Options::forward_only(9, window as usize);
                let reports = run(engine, &spec, options, |pipe| run_stage(pipe, &observer))
                    .unwrap_or_else(|e| panic!("{engine:?} {widths:?} window {window}: {e}"));
                check_totals(widths, 9, true, &reports);
                let violations = observer
                    .violations
                    .into_inner()
                    .unwrap_or_else(|e| e.into_inner());
                assert!(
                    violations.is_empty(),
                    "{engine:?} {widths:?}: {violations:?}"
                );
            }
        }
    }
}

#[test]
fn a_failing_stage_makes_its_neighbours_fail_naming_it() {
    let spec = spec_for(&[1, 2, 1]);
    for engine in ENGINES {
        let err = run(engine, &spec, Options::training(12), |pipe| {
            if pipe.plan().rank() == 2 {
                pipe.recv("h1", 1, Direction::Forward)?;
                let h2 = expected("h2", DataType::F32, 1, Direction::Forward)?;
                pipe.send("h2", h2, 1, Direction::Forward)?;
                return Err(TestError("injected failure on rank 2".into()));
            }
            run_stage(pipe, &())
        })
        .expect_err("rank 2 failed");
        // (With helper threads every failure counts as a root cause for
        // kolo-threads, which only sees its own communicators.)
        let failed = err
            .failures
            .iter()
            .find(|f| f.rank == 2)
            .map(|f| f.message.as_str());
        assert_eq!(
            failed,
            Some("injected failure on rank 2"),
            "{engine:?}: {err}"
        );
        for neighbour in [0, 3] {
            let failure = err.failures.iter().find(|f| f.rank == neighbour);
            let message = failure.map_or("did not fail", |f| &f.message);
            assert!(
                message.contains("rank 2 (stage 1) failed") && message.contains("injected failure"),
                "{engine:?}, rank {neighbour}: {message}"
            );
        }
    }
}

#[test]
fn a_panicking_stage_makes_its_neighbours_fail_naming_it() {
    let spec = spec_for(&[1, 2, 1]);
    for engine in ENGINES {
        let err = run(engine, &spec, Options::training(8), |pipe| {
            if pipe.plan().rank() == 3 {
                pipe.recv("h2", 0, Direction::Forward)?;
                panic!("stage 2 blew up");
            }
            run_stage(pipe, &())
        })
        .expect_err("rank 3 panicked");
        let failed = err.failures.iter().find(|f| f.rank == 3);
        assert_eq!(failed.map(|f| f.panicked), Some(true), "{engine:?}: {err}");
        for neighbour in [1, 2] {
            let failure = err.failures.iter().find(|f| f.rank == neighbour);
            let message = failure.map_or("did not fail", |f| &f.message);
            assert!(
                message.contains("rank 3 (stage 2) failed"),
                "{engine:?}, rank {neighbour}: {message}"
            );
        }
    }
}

/// Misuse is an error naming what is wrong, never a hang.
#[test]
fn misuse_is_reported_not_hung() {
    let spec = spec_for(&[1, 2]);
    for engine in ENGINES {
        run(engine, &spec, Options::training(4), |pipe| {
            let rank = pipe.plan().rank();
            let fwd = Direction::Forward;
            let h1 = |g| expected("h1", DataType::F32, g, fwd);
            let text =
                |r: Result<(), PipelineError>| r.err().map(|e| e.to_string()).unwrap_or_default();
            if rank == 0 {
                let e = text(pipe.send("nope", h1(0)?, 0, fwd));
                assert_eq!(e, "no tensor named 'nope' is described in the pipeline");
                let e = text(pipe.recv("h1", 0, fwd).map(drop));
                assert!(
                    e.contains(
                        "does not receive tensor 'h1' forward: it is received forward by stage 1"
                    ),
                    "{e}"
                );
                let e = text(pipe.send("h1", Tensor::new([1], vec![1i64])?, 0, fwd));
                assert!(
                    e.contains("described as f32, but forward a send carries i64"),
                    "{e}"
                );
                let e = text(pipe.send("h1", h1(2)?, 2, fwd));
                assert!(
                    e.contains("minibatch 2 sent when minibatch 0 is next"),
                    "{e}"
                );
                let e = text(pipe.send("h1", h1(9)?, 9, fwd));
                assert!(e.contains("beyond the run's 4 minibatches"), "{e}");
                let e = text(pipe.send(
                    "labels",
                    Tensor::new([1], vec![1i64])?,
                    0,
                    Direction::Backward,
                ));
                assert!(e.contains("it is sent backward by stage 1"), "{e}");
                pipe.send("h1", h1(0)?, 0, fwd)?;
                let e = text(pipe.send("h1", h1(0)?, 0, fwd));
                assert!(e.contains("minibatch 0 was already sent"), "{e}");
                let e = text(pipe.wait());
                assert!(
                    e.contains("tensor 'h1' forward with rank 1: 1 of 2 minibatches sent"),
                    "{e}"
                );
            } else {
                let e = text(pipe.recv("h1", 3 - (rank as u64 - 1), fwd).map(drop));
                assert!(e.contains("belongs to replica"), "{e}");
                let e = text(pipe.send(
                    "labels",
                    Tensor::new([1], vec![1i64])?,
                    rank as u64 - 1,
                    Direction::Backward,
                ));
                assert!(e.contains("it has no gradient"), "{e}");
            }
            run_stage_after_misuse(pipe)
        })
        .unwrap_or_else(|e| panic!("{engine:?}: {e}"));
    }
}

/// Completes the run begun by `misuse_is_reported_not_hung` (rank 0 sent
/// minibatch 0 of "h1" already).
fn run_stage_after_misuse(pipe: &Pipeline) -> Result<(), TestError> {
    let rank = pipe.plan().rank();
    for g in 0..4u64 {
        if rank == 0 {
            if g > 0 {
                pipe.send(
                    "h1",
                    expected("h1", DataType::F32, g, Direction::Forward)?,
                    g,
                    Direction::Forward,
                )?;
            }
            pipe.send(
                "labels",
                expected("labels", DataType::I64, g, Direction::Forward)?,
                g,
                Direction::Forward,
            )?;
        } else if g % 2 == rank as u64 - 1 {
            pipe.recv("h1", g, Direction::Forward)?;
            pipe.recv("labels", g, Direction::Forward)?;
            let e = pipe
                .recv("labels", g, Direction::Forward)
                .map(drop)
                .err()
                .map(|e| e.to_string());
            assert!(e.unwrap_or_default().contains("was already received"));
            pipe.send(
                "h1",
                expected("h1", DataType::F32, g, Direction::Backward)?,
                g,
                Direction::Backward,
            )?;
        }
    }
    if rank == 0 {
        for g in 0..4 {
            pipe.recv("h1", g, Direction::Backward)?;
        }
    }
    Ok(())
}

#[test]
fn unfinished_receives_fail_the_finish() {
    let spec = spec_for(&[1, 1]);
    let err = run(
        Engine::Threaded,
        &spec,
        Options::forward_only(3, 2),
        |pipe| {
            if pipe.plan().rank() == 0 {
                for g in 0..3 {
                    for name in ["h1", "labels"] {
                        let dtype = pipe.plan().tensor(name).map_or(DataType::F32, |t| t.dtype);
                        pipe.send(
                            name,
                            expected(name, dtype, g, Direction::Forward)?,
                            g,
                            Direction::Forward,
                        )?;
                    }
                }
            }
            Ok(())
        },
    )
    .expect_err("rank 1 took nothing");
    let messages: Vec<String> = err.failures.iter().map(|f| f.to_string()).collect();
    assert!(
        messages.iter().any(|m| m.starts_with(
            "rank 1 failed: tensor 'h1' forward with rank 0: 0 of 3 minibatches taken"
        )),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("rank 0 failed: rank 1 (stage 1) failed")),
        "{messages:?}"
    );
}

#[test]
fn serial_runs_follow_each_other_on_one_communicator() {
    let spec = spec_for(&[1, 2, 1]);
    let runs = [
        Options::forward_only(5, 1),
        Options::training(6),
        Options::forward_only(4, 2),
        Options::training(3),
    ];
    kolo_threads::run(spec.world_size, |comm| -> Result<(), TestError> {
        for options in runs {
            let plan = StagePlan::new(&spec, comm.rank())?;
            run_serial(plan, options, comm, |pipe| run_stage(pipe, &()))?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn start_needs_the_channels_of_its_run() {
    let spec = spec_for(&[1, 2]);
    let mut sets = thread_channels(&spec, &Options::training(4));
    let set = sets
        .swap_remove(0)
        .into_inner()
        .ok()
        .flatten()
        .expect("rank 0's set");
    let plan = StagePlan::new(&spec, 0).expect("plan");
    let err = Pipeline::start(plan, Options::forward_only(4, 1), set).expect_err("no ack channels");
    assert!(
        err.to_string()
            .contains("rank 0 has no end of channel Acks of 'h1' from rank 1 to rank 0"),
        "{err}"
    );
}

/// Without NCCL channels a device tensor is refused before anything moves
/// (no GPU needed to ask): the error names the tensor, the direction and
/// the channel's ranks, sender first, on both ends; host tensors then move
/// as always.
#[test]
fn device_tensors_are_refused_off_nccl_naming_the_channel() {
    for engine in ENGINES {
        let spec = spec_for(&[1, 1]);
        let reports = run(engine, &spec, Options::training(2), |pipe| {
            let rank = pipe.plan().rank();
            for (direction, sender, receiver) in
                [(Direction::Forward, 0, 1), (Direction::Backward, 1, 0)]
            {
                let err = match pipe.check_device("h1", 0, direction) {
                    Err(e @ PipelineError::DeviceUnsupported { .. }) => e.to_string(),
                    other => return Err(TestError(format!("rank {rank}: {other:?}"))),
                };
                let channel = format!("channel from rank {sender} to rank {receiver}");
                let why = if engine == Engine::Serial {
                    "serial engine"
                } else {
                    "only NCCL channels"
                };
                if !err.starts_with(&format!("tensor 'h1' {direction}"))
                    || !err.contains(&channel)
                    || !err.contains(why)
                {
                    return Err(TestError(format!("{engine:?} rank {rank}: {err}")));
                }
            }
            run_stage(pipe, &())
        })
        .unwrap_or_else(|e| panic!("{engine:?}: {e}"));
        check_totals(&[1, 1], 2, false, &reports);
    }
}
