//! The timeline end to end: calls in, a file a viewer loads out.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kolo_timeline::{activity, Timeline, TimelineError};
use serde_json::json;

fn temp_trace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("timeline.json");
    (dir, path)
}

/// One tensor's whole life, as the engine records it.
fn allreduce(timeline: &Timeline, tensor: &str, ranks: u32, shape: &[u64]) {
    timeline.negotiate_start(tensor, "ALLREDUCE");
    for rank in 0..ranks {
        timeline.negotiate_rank_ready(tensor, rank);
    }
    timeline.negotiate_end(tensor);
    timeline.op_start(tensor, "ALLREDUCE");
    for name in [
        activity::QUEUE,
        activity::MEMCPY_IN_FUSION_BUFFER,
        activity::ALLREDUCE,
        activity::MEMCPY_OUT_FUSION_BUFFER,
    ] {
        timeline.activity_start(tensor, name);
        timeline.activity_end(tensor);
    }
    timeline.op_end(tensor, "float32", shape);
}

#[test]
fn full_trace_is_balanced_nested_and_names_every_row() {
    let (_dir, path) = temp_trace();
    let timeline = Timeline::create(&path, true).expect("create");
    assert!(timeline.is_enabled());
    assert_eq!(timeline.path(), Some(path.as_path()));
    let tensors = ["grad/w1", "grad/b1", "grad/w2"];
    for (i, tensor) in tensors.iter().enumerate() {
        timeline.mark_cycle();
        allreduce(&timeline, tensor, 3, &[i as u64 + 1, 4]);
    }
    timeline.flush().expect("flush");

    let checked = common::check(&common::read(&path));
    assert!(checked.all_closed(), "open spans: {:?}", checked.open);
    assert_eq!(checked.rows.len(), 3);
    let cycles: Vec<_> = checked
        .ticks
        .iter()
        .filter(|t| t.name == "CYCLE_START")
        .collect();
    assert_eq!(cycles.len(), 3);
    assert!(cycles.iter().all(|t| t.scope == "g"));
    for (i, tensor) in tensors.iter().enumerate() {
        let ticks = checked.ticks_of(tensor);
        let ranks: Vec<_> = ticks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(ranks, ["0", "1", "2"]);
        assert!(ticks
            .iter()
            .all(|t| t.inside.as_deref() == Some("NEGOTIATE_ALLREDUCE")));
        let spans = checked.spans_of(tensor);
        let names: Vec<_> = spans
            .iter()
            .map(|s| (s.name.as_str(), s.parent.as_deref()))
            .collect();
        assert_eq!(
            names,
            [
                ("NEGOTIATE_ALLREDUCE", None),
                ("QUEUE", Some("ALLREDUCE")),
                ("MEMCPY_IN_FUSION_BUFFER", Some("ALLREDUCE")),
                ("ALLREDUCE", Some("ALLREDUCE")),
                ("MEMCPY_OUT_FUSION_BUFFER", Some("ALLREDUCE")),
                ("ALLREDUCE", None),
            ]
        );
        let op = spans[5];
        assert_eq!(
            op.end_args,
            Some(json!({"dtype": "float32", "shape": [i + 1, 4]}))
        );
        assert!(spans[0].end_ts <= op.begin_ts, "negotiation before the op");
    }
}

#[test]
fn file_loads_after_each_flush_while_the_timeline_lives() {
    let (_dir, path) = temp_trace();
    let timeline = Timeline::create(&path, false).expect("create");
    timeline.flush().expect("flush");
    assert!(
        common::read(&path).is_empty(),
        "an empty timeline is an empty array"
    );

    timeline.op_start("a", "BROADCAST");
    timeline.flush().expect("flush");
    let checked = common::check(&common::read(&path));
    assert_eq!(
        checked.open[&checked.pid("a")],
        ["BROADCAST"],
        "the open op is on disk"
    );

    timeline.op_end("a", "int64", &[]);
    allreduce(&timeline, "b", 2, &[8]);
    timeline.flush().expect("flush");
    let checked = common::check(&common::read(&path));
    assert!(checked.all_closed());
    assert_eq!(
        checked.spans_of("a")[0].end_args,
        Some(json!({"dtype": "int64", "shape": []}))
    );
    assert_eq!(checked.spans_of("b").len(), 6);
}

#[test]
fn file_loads_after_the_last_handle_is_dropped_without_flush() {
    let (_dir, path) = temp_trace();
    let timeline = Timeline::create(&path, false).expect("create");
    let clone = timeline.clone();
    allreduce(&clone, "x", 4, &[1]);
    drop(timeline);
    clone.op_start("y", "ALLGATHER");
    drop(clone);

    let text = std::fs::read_to_string(&path).expect("read");
    assert!(
        text.ends_with(",\n"),
        "left an unterminated array, as documented"
    );
    let checked = common::check(&kolo_timeline::parse_trace(&text).expect("parse"));
    assert_eq!(checked.spans_of("x").len(), 6);
    assert_eq!(checked.open[&checked.pid("y")], ["ALLGATHER"]);
}

#[test]
fn handles_on_several_threads_write_one_consistent_file() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 25;
    let (_dir, path) = temp_trace();
    let timeline = Timeline::create(&path, true).expect("create");
    timeline.negotiate_start("shared", "ALLREDUCE");
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let timeline = timeline.clone();
            scope.spawn(move || {
                for i in 0..PER_THREAD {
                    timeline.mark_cycle();
                    allreduce(
                        &timeline,
                        &format!("t{t}/grad{i}"),
                        2,
                        &[t as u64, i as u64],
                    );
                    timeline.negotiate_rank_ready("shared", t as u32);
                    if i % 10 == 0 {
                        timeline.flush().expect("flush from a worker");
                    }
                }
            });
        }
    });
    timeline.negotiate_end("shared");
    timeline.flush().expect("flush");

    let checked = common::check(&common::read(&path));
    assert!(checked.all_closed());
    assert_eq!(checked.rows.len(), THREADS * PER_THREAD + 1);
    let mut pids: Vec<_> = checked.rows.keys().copied().collect();
    pids.sort_unstable();
    assert_eq!(
        pids,
        (1..=checked.rows.len() as u64).collect::<Vec<_>>(),
        "pids are dense"
    );
    for t in 0..THREADS {
        for i in 0..PER_THREAD {
            let spans = checked.spans_of(&format!("t{t}/grad{i}"));
            assert_eq!(spans.len(), 6);
            assert_eq!(
                spans[5].end_args,
                Some(json!({"dtype": "float32", "shape": [t, i]}))
            );
        }
    }
    let shared = checked.ticks_of("shared");
    assert_eq!(shared.len(), THREADS * PER_THREAD);
    assert!(shared
        .iter()
        .all(|t| t.inside.as_deref() == Some("NEGOTIATE_ALLREDUCE")));
    assert_eq!(
        checked
            .ticks
            .iter()
            .filter(|t| t.name == "CYCLE_START")
            .count(),
        THREADS * PER_THREAD
    );
}

#[test]
fn a_fused_response_records_its_activities_on_every_row() {
    let (_dir, path) = temp_trace();
    let timeline = Timeline::create(&path, false).expect("create");
    let fused = ["f/a", "f/b", "f/c"];
    for tensor in fused {
        timeline.op_start(tensor, "ALLREDUCE");
    }
    timeline.activity_start_all(&fused, activity::MEMCPY_IN_FUSION_BUFFER);
    timeline.activity_end_all(&fused);
    timeline.activity_start_all(&fused, activity::ALLREDUCE);
    // op_end closes the still-open ALLREDUCE activity first.
    for tensor in fused {
        timeline.op_end(tensor, "bfloat16", &[16]);
    }
    timeline.flush().expect("flush");

    let checked = common::check(&common::read(&path));
    assert!(checked.all_closed());
    let begins: Vec<f64> = fused
        .iter()
        .map(|t| checked.spans_of(t)[0].begin_ts)
        .collect();
    assert!(
        begins.iter().all(|ts| *ts == begins[0]),
        "same stamp for the fused copy-in: {begins:?}"
    );
    for tensor in fused {
        let names: Vec<_> = checked
            .spans_of(tensor)
            .iter()
            .map(|s| (s.name.clone(), s.parent.clone()))
            .collect();
        let op = Some("ALLREDUCE".to_owned());
        assert_eq!(
            names,
            [
                ("MEMCPY_IN_FUSION_BUFFER".to_owned(), op.clone()),
                ("ALLREDUCE".to_owned(), op.clone()),
                ("ALLREDUCE".to_owned(), None),
            ]
        );
    }
}

#[test]
fn cycle_markers_only_when_asked_for() {
    let (_dir, path) = temp_trace();
    let timeline = Timeline::create(&path, false).expect("create");
    timeline.mark_cycle();
    allreduce(&timeline, "a", 1, &[1]);
    timeline.mark_cycle();
    timeline.flush().expect("flush");
    let checked = common::check(&common::read(&path));
    assert!(checked.ticks.iter().all(|t| t.name != "CYCLE_START"));
    assert_eq!(checked.spans_of("a").len(), 6);
}

#[test]
fn tensor_names_that_need_escaping_survive() {
    let (_dir, path) = temp_trace();
    let timeline = Timeline::create(&path, false).expect("create");
    let names = ["quote\"d", "back\\slash", "new\nline", "ünï/🦀", ""];
    for name in names {
        allreduce(&timeline, name, 1, &[2]);
    }
    drop(timeline);
    let checked = common::check(&common::read(&path));
    for name in names {
        assert_eq!(checked.spans_of(name).len(), 6, "{name:?}");
    }
}

#[test]
fn create_error_names_the_path() {
    let (dir, _) = temp_trace();
    let path = dir.path().join("no/such/dir/timeline.json");
    let error = Timeline::create(&path, false).expect_err("missing directory");
    assert!(matches!(&error, TimelineError::Create { path: p, .. } if *p == path));
    assert!(
        error.to_string().contains("no/such/dir/timeline.json"),
        "{error}"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_is_reported_by_every_later_flush() {
    let full = std::path::Path::new("/dev/full");
    assert!(full.exists(), "Linux has /dev/full");
    let timeline =
        Timeline::create(full, false).expect("opening /dev/full succeeds; writing fails");
    allreduce(&timeline, "a", 2, &[3]);
    for _ in 0..2 {
        match timeline.flush() {
            Err(TimelineError::Write { path, source }) => {
                assert_eq!(path, full);
                assert_eq!(source.raw_os_error(), None, "rebuilt from the first error");
                assert!(!source.to_string().is_empty());
            }
            other => panic!("expected a write error, got {other:?}"),
        }
    }
    // Dropping a failed timeline neither panics nor hangs.
    drop(timeline);
}

#[test]
fn disabled_timeline_records_nothing_and_flushes_fine() {
    let (dir, _) = temp_trace();
    let timeline = Timeline::disabled();
    assert!(!timeline.is_enabled());
    assert_eq!(timeline.path(), None);
    assert!(!Timeline::default().is_enabled());
    allreduce(&timeline, "a", 2, &[3]);
    timeline.mark_cycle();
    timeline.activity_start_all(&["a", "b"], activity::QUEUE);
    timeline.activity_end_all(&["a", "b"]);
    timeline.flush().expect("disabled flush is Ok");
    assert_eq!(format!("{timeline:?}"), "Timeline(disabled)");
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
}

#[test]
fn events_reach_the_disk_without_an_explicit_flush() {
    let (_dir, path) = temp_trace();
    let timeline = Timeline::create(&path, false).expect("create");
    timeline.op_start("periodic", "ALLREDUCE");
    // The writer flushes about once a second; allow a generous margin.
    let deadline = Instant::now() + Duration::from_secs(20);
    let found = loop {
        let text = std::fs::read_to_string(&path).expect("read");
        if text.contains("periodic") {
            break Some(text);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = found.expect("the periodic flush wrote the event");
    let checked = common::check(&kolo_timeline::parse_trace(&text).expect("parse"));
    assert_eq!(checked.open[&checked.pid("periodic")], ["ALLREDUCE"]);
    drop(timeline);
}
