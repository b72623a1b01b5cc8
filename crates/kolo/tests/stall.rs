//! The stall inspector: a warning naming the missing ranks, and the stall
//! shutdown that fails the withheld tensor instead of waiting forever.

mod common;

use common::{config, expect_err};
use kolo::{Error, ReduceOp};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Records every event's fields as one line of text.
struct Recorder(Arc<Mutex<Vec<String>>>);

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() <= tracing::Level::WARN {
            let mut line = Line(String::new());
            event.record(&mut line);
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(line.0);
        }
    }
}

/// The warnings logged by any thread of this test binary so far.
fn warnings() -> Arc<Mutex<Vec<String>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<String>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Recorder(Arc::clone(&log)));
        tracing::subscriber::set_global_default(subscriber)
            .expect("the only subscriber of this binary");
        log
    })
    .clone()
}

#[test]
fn a_late_rank_is_named_in_a_warning() {
    let log = warnings();
    let config = config().stall_check(Some(Duration::from_millis(100)));
    kolo::threads::run(3, config, |kolo| {
        if kolo.rank() == 1 {
            std::thread::sleep(Duration::from_millis(600));
        }
        let mut x = [1i32; 4];
        kolo.allreduce("late/tensor", &mut x, ReduceOp::Sum)?;
        assert_eq!(x, [3; 4]);
        Ok(())
    })
    .unwrap();
    let lines = log.lock().unwrap().clone();
    assert!(
        lines.iter().any(|l| l.contains("late/tensor")
            && l.contains("missing from ranks [1]")
            && l.contains("submitted by ranks [0, 2]")),
        "no stall warning in {lines:#?}"
    );
}

#[test]
fn a_withheld_tensor_fails_and_the_engine_shuts_down() {
    let config = config()
        .stall_check(Some(Duration::from_millis(50)))
        .stall_shutdown(Some(Duration::from_millis(300)));
    let outcomes = kolo::threads::run(3, config, |kolo| {
        let mut x = [1i32; 4];
        if kolo.rank() == 2 {
            // Never submits "withheld"; by the time it tries something else
            // the engine has stopped.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !kolo.is_shut_down() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let err = expect_err(
                kolo.allreduce("later", &mut x, ReduceOp::Sum),
                "after the stall",
            );
            return Ok(format!("{err}"));
        }
        let err = expect_err(
            kolo.allreduce("withheld", &mut x, ReduceOp::Sum),
            "withheld",
        );
        match &err {
            Error::Stalled { tensor, message } => {
                assert_eq!(tensor, "withheld");
                assert!(message.contains("missing from ranks [2]"), "{message}");
            }
            other => panic!("expected a stall error, got {other:?}"),
        }
        assert_eq!(x, [1; 4], "a failed operation leaves the buffer alone");
        let later = expect_err(
            kolo.allreduce("later", &mut x, ReduceOp::Sum),
            "after the stall",
        );
        assert_eq!(later, Error::ShutDown { by_ranks: vec![] });
        Ok(format!("{later}"))
    })
    .unwrap();
    for outcome in outcomes {
        assert_eq!(outcome, "kolo was shut down by the stall inspector");
    }
}
