//! The stall inspector: a warning naming the missing ranks, and the stall
//! shutdown that fails the withheld tensor instead of waiting forever
//! (the cases of [`crate::STALL`], with [`settings`]).

use crate::{expect_err, Digest};
use kolo::{Config, Error, Kolo, ReduceOp};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// How long rank 1 is late in [`late_rank_warning`]: well past the
/// warning, well before the shutdown of [`settings`].
const LATE: Duration = Duration::from_millis(400);

/// The stall jobs' settings: warn after 100 ms, shut down after 1 s.
pub fn settings(config: Config) -> Config {
    config
        .stall_check(Some(Duration::from_millis(100)))
        .stall_shutdown(Some(Duration::from_secs(1)))
}

/// Records every warning's fields as one line of text.
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

/// The warnings logged by any thread of this process since the first
/// call, or why they cannot be recorded (another global subscriber).
pub fn warnings() -> Result<Arc<Mutex<Vec<String>>>, String> {
    static LOG: OnceLock<Result<Arc<Mutex<Vec<String>>>, String>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Recorder(Arc::clone(&log)));
        tracing::subscriber::set_global_default(subscriber)
            .map(|()| log)
            .map_err(|e| format!("cannot record warnings: {e}"))
    })
    .clone()
}

/// Rank 1 submits 400 ms after the others: the operation completes, and
/// rank 0 (the coordinator, whose stall inspector warns) logged a warning
/// naming the tensor, the missing rank and the ranks that submitted.
pub fn late_rank_warning(kolo: &Kolo) -> Result<Digest, Error> {
    let log = warnings().map_err(|reason| Error::InvalidArgument {
        tensor: "late/tensor".into(),
        reason,
    })?;
    let (r, n) = (kolo.rank(), kolo.size());
    kolo.barrier()?;
    if r == 1 {
        std::thread::sleep(LATE);
    }
    let mut x = [1i32; 4];
    kolo.allreduce("late/tensor", &mut x, ReduceOp::Sum)?;
    assert_eq!(x, [n as i32; 4]);
    if r == 0 {
        let others: Vec<usize> = (0..n).filter(|&p| p != 1).collect();
        let submitted = format!("submitted by ranks {others:?}");
        let lines = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(
            lines.iter().any(|l| l.contains("late/tensor")
                && l.contains("missing from ranks [1]")
                && l.contains(&submitted)),
            "no stall warning in {lines:#?}"
        );
    }
    Ok(None)
}

/// The last rank never submits "withheld": after the stall shutdown time
/// the others' operation fails naming it, and the engine shuts down on
/// every rank. Ends the engine, so it is the last case of its job.
pub fn withheld_tensor(kolo: &Kolo) -> Result<Digest, Error> {
    const SHUT_DOWN: &str = "kolo was shut down by the stall inspector";
    let (r, n) = (kolo.rank(), kolo.size());
    let mut x = [1i32; 4];
    if r == n - 1 {
        // Never submits "withheld"; by the time it tries something else
        // the engine has stopped.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !kolo.is_shut_down() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let err = expect_err(
            kolo.allreduce("later", &mut x, ReduceOp::Sum),
            "after the stall",
        );
        assert_eq!(err.to_string(), SHUT_DOWN);
        return Ok(None);
    }
    let err = expect_err(
        kolo.allreduce("withheld", &mut x, ReduceOp::Sum),
        "withheld",
    );
    match &err {
        Error::Stalled { tensor, message } => {
            assert_eq!(tensor, "withheld");
            let missing = format!("missing from ranks [{}]", n - 1);
            assert!(message.contains(&missing), "{message}");
        }
        other => panic!("expected a stall error, got {other:?}"),
    }
    assert_eq!(x, [1; 4], "a failed operation leaves the buffer alone");
    let later = expect_err(
        kolo.allreduce("later", &mut x, ReduceOp::Sum),
        "after the stall",
    );
    assert_eq!(later, Error::ShutDown { by_ranks: vec![] });
    assert_eq!(later.to_string(), SHUT_DOWN);
    Ok(None)
}

/// The timeout jobs' settings: operations time out after 1 s (the stall
/// shutdown is off, so the timeout decides), no stall warning.
pub fn timeout_settings(config: Config) -> Config {
    config
        .stall_check(None)
        .stall_shutdown(None)
        .timeout(Duration::from_secs(1))
}

/// The last rank never submits "withheld": after the operation timeout
/// the others' operation fails with [`Error::Timeout`] naming the tensor,
/// the timeout and the rank that did not submit it, and the engine stops
/// on every rank. Ends the engine, so it is the last case of its job.
pub fn withheld_tensor_times_out(kolo: &Kolo) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    let mut x = [1i32; 4];
    if r == n - 1 {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !kolo.is_shut_down() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        expect_err(
            kolo.allreduce("later", &mut x, ReduceOp::Sum),
            "after the timeout",
        );
        return Ok(None);
    }
    let started = Instant::now();
    let err = expect_err(
        kolo.allreduce("withheld", &mut x, ReduceOp::Sum),
        "withheld",
    );
    match &err {
        Error::Timeout {
            tensor,
            after,
            report,
        } => {
            assert_eq!(tensor, "withheld");
            assert_eq!(*after, Duration::from_secs(1));
            let missing = format!("missing from ranks [{}]", n - 1);
            assert!(report.contains(&missing), "{report}");
            assert!(err.to_string().contains("KOLO_TIMEOUT"), "{err}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the timeout took {:?}",
        started.elapsed()
    );
    assert_eq!(x, [1; 4], "a failed operation leaves the buffer alone");
    expect_err(
        kolo.allreduce("later", &mut x, ReduceOp::Sum),
        "after the timeout",
    );
    Ok(None)
}
