//! The completion thread: ONE per device (not one per operation) watches
//! the done events of everything enqueued on the communicator's stream and
//! completes the [`Work`] handles in order.
//!
//! The core, [`Queue`], is a plain data structure over [`Fence`]s (tested
//! with fake fences); [`Completer`] is the thread around it. The thread
//! polls `cuEventQuery` with a short backoff while work is pending, spins
//! briefly on its channel when idle and then sleeps on it, asks NCCL for
//! asynchronous errors every few milliseconds, and fails everything
//! pending when a fence errors, an operation outlives the timeout, or NCCL
//! reports a failure.

use crate::error::NcclError;
use crate::safe::work::{Health, WorkState};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Something that completes on the GPU (a recorded event).
pub(crate) trait Fence: Send + 'static {
    /// `Ok(true)` once complete; an error if the device failed.
    fn poll(&mut self) -> Result<bool, NcclError>;
}

/// One tracked operation.
pub(crate) struct Entry<F> {
    pub(crate) fence: F,
    pub(crate) work: Arc<WorkState>,
    /// Names the operation in timeout errors.
    pub(crate) what: String,
    pub(crate) since: Instant,
}

/// What one [`Queue::poll_then`] did.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Progress {
    pub(crate) completed: usize,
    pub(crate) pending: usize,
    /// Set when this poll failed the queue.
    pub(crate) failure: Option<NcclError>,
}

/// Tracked operations in enqueue order.
pub(crate) struct Queue<F> {
    entries: VecDeque<Entry<F>>,
    timeout: Duration,
}

impl<F: Fence> Queue<F> {
    pub(crate) fn new(timeout: Duration) -> Self {
        Queue {
            entries: VecDeque::new(),
            timeout,
        }
    }

    pub(crate) fn push(&mut self, entry: Entry<F>) {
        self.entries.push_back(entry);
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// [`Queue::poll_then`] with nothing to call first.
    #[cfg(test)]
    pub(crate) fn poll(&mut self, now: Instant) -> Progress {
        self.poll_then(now, |_| {})
    }

    /// Completes the entries whose fences are done, oldest first, up to
    /// the first one still pending: the fences are events recorded on one
    /// stream, which complete in order, so later ones need no query (with
    /// hundreds of operations in flight, querying each on every poll kept
    /// the driver busy against the thread enqueueing more). A fence error,
    /// or the oldest pending entry older than the timeout at `now`, fails
    /// every entry and is returned as the failure.
    /// `first` is called with the failure before the failed entries'
    /// waiters wake: a waiter that goes on to submit more must find the
    /// communicator already marked broken.
    pub(crate) fn poll_then(&mut self, now: Instant, first: impl FnOnce(&NcclError)) -> Progress {
        let mut progress = Progress::default();
        let mut failure = None;
        while let Some(entry) = self.entries.front_mut() {
            match entry.fence.poll() {
                Ok(true) => {
                    if let Some(done) = self.entries.pop_front() {
                        done.work.complete(Ok(()));
                        progress.completed += 1;
                    }
                }
                Ok(false) if now.saturating_duration_since(entry.since) > self.timeout => {
                    failure = Some(NcclError::Timeout {
                        what: entry.what.clone(),
                        seconds: self.timeout.as_secs_f64(),
                    });
                    break;
                }
                Ok(false) => break,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(cause) = failure {
            first(&cause);
            self.fail_all(&cause);
            progress.failure = Some(cause);
        }
        progress.pending = self.entries.len();
        progress
    }

    /// Fails every pending entry with `cause` (dropping their fences).
    pub(crate) fn fail_all(&mut self, cause: &NcclError) {
        for entry in self.entries.drain(..) {
            entry.work.complete(Err(cause.clone()));
        }
    }
}

/// Spin, then yield, then sleep briefly: low latency for short operations
/// without burning a core on long ones. While spinning, polls are spaced
/// by [`SPIN_GAP`] of busy waiting rather than issued back to back: each
/// `cuEventQuery` enters the driver, which the thread enqueueing the next
/// operations needs too.
#[derive(Default)]
struct Backoff {
    idle_polls: u32,
}

/// The busy wait between two polls while spinning.
const SPIN_GAP: Duration = Duration::from_micros(1);

impl Backoff {
    fn reset(&mut self) {
        self.idle_polls = 0;
    }

    fn snooze(&mut self) {
        self.idle_polls = self.idle_polls.saturating_add(1);
        match self.idle_polls {
            0..=64 => {
                let until = Instant::now() + SPIN_GAP;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            65..=512 => std::thread::yield_now(),
            n => std::thread::sleep(Duration::from_micros(u64::from((n - 512).min(100) + 10))),
        }
    }
}

/// How long the thread polls its channel, with nothing to watch, before
/// it blocks on it.
const IDLE_SPIN: Duration = Duration::from_micros(100);

/// Polls `rx` for up to [`IDLE_SPIN`]; `None` if nothing came (or the
/// channel closed, which the blocking receive then reports).
fn idle_spin<F>(rx: &Receiver<Msg<F>>) -> Option<Msg<F>> {
    let until = Instant::now() + IDLE_SPIN;
    loop {
        match rx.try_recv() {
            Ok(msg) => return Some(msg),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
            Err(crossbeam_channel::TryRecvError::Empty) if Instant::now() >= until => return None,
            Err(crossbeam_channel::TryRecvError::Empty) => std::hint::spin_loop(),
        }
    }
}

enum Msg<F> {
    Track(Entry<F>),
    Stop,
}

/// How often NCCL's asynchronous error is polled.
const HEALTH_PERIOD: Duration = Duration::from_millis(5);

/// The completion thread of one device.
pub(crate) struct Completer<F: Fence> {
    tx: Sender<Msg<F>>,
    thread: Option<JoinHandle<()>>,
    health: Arc<Health>,
}

/// The completion thread's hold on the communicator.
pub(crate) trait Watch: Send + 'static {
    /// NCCL's asynchronous error, once it recorded one.
    fn check(&mut self) -> Option<NcclError>;
    /// Ends what the device still runs for the communicator after a
    /// failure, so that no kernel and no host thread waits for it forever;
    /// `true` when this call aborted it.
    fn abort(&mut self) -> bool;
}

/// Runs first on the thread (binds the device's CUDA context).
pub(crate) type ThreadInit = Box<dyn FnOnce() -> Result<(), NcclError> + Send>;

impl<F: Fence> Completer<F> {
    /// Starts the thread `name`. `watch` is asked for NCCL's asynchronous
    /// error every few milliseconds, and told to abort once this thread
    /// fails the pending work (a timeout, a device or an NCCL error).
    pub(crate) fn start(
        name: String,
        timeout: Duration,
        health: Arc<Health>,
        init: ThreadInit,
        watch: Box<dyn Watch>,
    ) -> Result<Self, NcclError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread_health = health.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(rx, Queue::new(timeout), thread_health, init, watch))
            .map_err(|e| {
                NcclError::InvalidArgument(format!("cannot start the completion thread: {e}"))
            })?;
        Ok(Completer {
            tx,
            thread: Some(thread),
            health,
        })
    }

    /// Tracks `entry`; if the thread is gone or the communicator broken, the
    /// entry fails at once.
    pub(crate) fn track(&self, entry: Entry<F>) {
        if let Err(e) = self.health.check() {
            entry.work.complete(Err(e));
            return;
        }
        if let Err(crossbeam_channel::SendError(Msg::Track(entry))) =
            self.tx.send(Msg::Track(entry))
        {
            entry.work.complete(Err(NcclError::ShutDown));
        }
    }

    /// Stops the thread: pending entries fail with [`NcclError::ShutDown`].
    pub(crate) fn stop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<F: Fence> Drop for Completer<F> {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run<F: Fence>(
    rx: Receiver<Msg<F>>,
    mut queue: Queue<F>,
    health: Arc<Health>,
    init: ThreadInit,
    mut watch: Box<dyn Watch>,
) {
    if let Err(e) = init() {
        health.fail(&e);
    }
    let mut backoff = Backoff::default();
    let mut last_check = Instant::now();
    loop {
        // Take new entries: block only when there has been nothing to
        // watch for a while. Spinning first keeps the enqueuing thread
        // from waking this one (a futex wake, microseconds on a virtual
        // machine) for every operation of a back-to-back stream.
        let first = if queue.len() == 0 {
            match idle_spin(&rx) {
                Some(msg) => Some(msg),
                None => match rx.recv_timeout(HEALTH_PERIOD * 10) {
                    Ok(msg) => Some(msg),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                },
            }
        } else {
            rx.try_recv().ok()
        };
        let mut stop = false;
        for msg in first.into_iter().chain(rx.try_iter()) {
            match msg {
                Msg::Track(entry) => queue.push(entry),
                Msg::Stop => stop = true,
            }
        }
        if stop {
            break;
        }
        let now = Instant::now();
        if health.is_broken() {
            queue.fail_all(&health.broken_error());
        }
        let progress = queue.poll_then(now, |cause| health.fail(cause));
        let mut failed = progress.failure.is_some();
        if now.duration_since(last_check) >= HEALTH_PERIOD {
            last_check = now;
            if let Some(cause) = watch.check() {
                health.fail(&cause);
                queue.fail_all(&cause);
                failed = true;
            }
        }
        // The waiters have their errors and the health its cause; now end
        // what still runs on the device, without waiting for the owner to
        // tear the communicator down.
        if failed && watch.abort() {
            health.note_aborted();
        }
        if progress.completed == 0 && progress.pending > 0 {
            backoff.snooze();
        } else {
            backoff.reset();
        }
    }
    queue.fail_all(&NcclError::ShutDown);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safe::work::Work;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Done once its flag is set; fails when asked to.
    struct FakeFence {
        done: Arc<AtomicBool>,
        fail: bool,
    }

    impl Fence for FakeFence {
        fn poll(&mut self) -> Result<bool, NcclError> {
            if self.fail {
                return Err(NcclError::Cuda {
                    call: "cuEventQuery",
                    message: "illegal address".into(),
                });
            }
            Ok(self.done.load(Ordering::SeqCst))
        }
    }

    fn entry(done: &Arc<AtomicBool>, fail: bool, since: Instant) -> (Work, Entry<FakeFence>) {
        let (work, state) = Work::pending();
        let fence = FakeFence {
            done: done.clone(),
            fail,
        };
        (
            work,
            Entry {
                fence,
                work: state,
                what: "allreduce of 4 f32".into(),
                since,
            },
        )
    }

    #[test]
    fn completes_entries_in_order_up_to_the_first_pending() {
        let now = Instant::now();
        let mut queue = Queue::new(Duration::from_secs(10));
        let (a_done, b_done) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (a, ea) = entry(&a_done, false, now);
        let (b, eb) = entry(&b_done, false, now);
        queue.push(ea);
        queue.push(eb);
        assert_eq!(
            queue.poll(now),
            Progress {
                completed: 0,
                pending: 2,
                failure: None
            }
        );
        // In order: a later fence is not even queried while an earlier
        // one is pending.
        b_done.store(true, Ordering::SeqCst);
        assert_eq!(queue.poll(now).completed, 0);
        assert_eq!((a.poll(), b.poll()), (None, None));
        a_done.store(true, Ordering::SeqCst);
        assert_eq!(
            queue.poll(now),
            Progress {
                completed: 2,
                pending: 0,
                failure: None
            }
        );
        assert_eq!((a.poll(), b.poll()), (Some(Ok(())), Some(Ok(()))));
    }

    #[test]
    fn a_timeout_fails_everything_pending_naming_the_operation() {
        let start = Instant::now();
        let mut queue = Queue::new(Duration::from_millis(100));
        let never = Arc::new(AtomicBool::new(false));
        let (a, ea) = entry(&never, false, start);
        let (b, eb) = entry(&never, false, start + Duration::from_millis(90));
        queue.push(ea);
        queue.push(eb);
        assert!(queue
            .poll(start + Duration::from_millis(50))
            .failure
            .is_none());
        let progress = queue.poll(start + Duration::from_millis(150));
        assert!(
            matches!(&progress.failure, Some(NcclError::Timeout { what, .. }) if what.contains("allreduce"))
        );
        assert_eq!(progress.pending, 0);
        assert!(matches!(a.poll(), Some(Err(NcclError::Timeout { .. }))));
        assert!(matches!(b.poll(), Some(Err(NcclError::Timeout { .. }))));
    }

    #[test]
    fn a_device_error_fails_everything_pending() {
        let now = Instant::now();
        let mut queue = Queue::new(Duration::from_secs(10));
        let flag = Arc::new(AtomicBool::new(false));
        let (a, ea) = entry(&flag, true, now);
        let (b, eb) = entry(&flag, false, now);
        queue.push(ea);
        queue.push(eb);
        let progress = queue.poll(now);
        assert!(matches!(progress.failure, Some(NcclError::Cuda { .. })));
        assert!(a.poll().unwrap().is_err() && b.poll().unwrap().is_err());
    }

    /// Reports an asynchronous error once `fail` is set; counts aborts.
    #[derive(Clone, Default)]
    struct FakeWatch {
        fail: Arc<AtomicBool>,
        aborts: Arc<AtomicUsize>,
    }

    impl Watch for FakeWatch {
        fn check(&mut self) -> Option<NcclError> {
            self.fail.load(Ordering::SeqCst).then(|| NcclError::Nccl {
                call: "asynchronous operation",
                code: 6,
                message: "remote process exited".into(),
            })
        }

        fn abort(&mut self) -> bool {
            self.aborts.fetch_add(1, Ordering::SeqCst) == 0
        }
    }

    impl FakeWatch {
        /// Whether the thread aborts within 10 s: it does so right after
        /// failing the handles, which wakes their waiters first.
        fn aborted_soon(&self) -> bool {
            let since = Instant::now();
            while self.aborts.load(Ordering::SeqCst) == 0 {
                if since.elapsed() > Duration::from_secs(10) {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            true
        }
    }

    fn started(timeout: Duration, health: &Arc<Health>, watch: &FakeWatch) -> Completer<FakeFence> {
        Completer::start(
            "test-completion".into(),
            timeout,
            health.clone(),
            Box::new(|| Ok(())),
            Box::new(watch.clone()),
        )
        .unwrap()
    }

    #[test]
    fn the_thread_completes_work_and_reports_async_errors() {
        let health = Arc::new(Health::new(0));
        let watch = FakeWatch::default();
        let fail_now = watch.fail.clone();
        let mut completer = started(Duration::from_secs(30), &health, &watch);
        let done = Arc::new(AtomicBool::new(false));
        let (first, e) = entry(&done, false, Instant::now());
        completer.track(e);
        done.store(true, Ordering::SeqCst);
        assert_eq!(first.wait_timeout(Duration::from_secs(10)), Ok(()));

        let never = Arc::new(AtomicBool::new(false));
        let (stuck, e) = entry(&never, false, Instant::now());
        completer.track(e);
        fail_now.store(true, Ordering::SeqCst);
        let err = stuck.wait_timeout(Duration::from_secs(10)).unwrap_err();
        assert!(err.to_string().contains("remote process exited"), "{err}");
        assert!(health.is_broken());
        assert!(watch.aborted_soon(), "the watchdog aborts");
        // Once broken, new work fails at once.
        let (late, e) = entry(&done, false, Instant::now());
        completer.track(e);
        assert!(matches!(late.poll(), Some(Err(NcclError::Broken { .. }))));
        completer.stop();
    }

    #[test]
    fn stopping_fails_pending_work_with_shutdown() {
        let health = Arc::new(Health::new(0));
        let watch = FakeWatch::default();
        let mut completer = started(Duration::from_secs(30), &health, &watch);
        let never = Arc::new(AtomicBool::new(false));
        let (work, e) = entry(&never, false, Instant::now());
        completer.track(e);
        completer.stop();
        assert_eq!(work.wait(), Err(NcclError::ShutDown));
        assert_eq!(
            watch.aborts.load(Ordering::SeqCst),
            0,
            "a shutdown leaves the communicator to its teardown"
        );
    }

    #[test]
    fn a_timeout_aborts_the_communicator_at_once() {
        let health = Arc::new(Health::new(1));
        let watch = FakeWatch::default();
        let mut completer = started(Duration::from_millis(50), &health, &watch);
        let never = Arc::new(AtomicBool::new(false));
        let (stuck, e) = entry(&never, false, Instant::now());
        completer.track(e);
        let err = stuck.wait_timeout(Duration::from_secs(10)).unwrap_err();
        assert!(
            matches!(&err, NcclError::Timeout { what, .. } if what.contains("allreduce")),
            "{err}"
        );
        assert!(watch.aborted_soon(), "no abort after the timeout");
        let broken = health.check().unwrap_err().to_string();
        assert!(
            broken.contains("timed out") && broken.contains("aborted"),
            "{broken}"
        );
        completer.stop();
    }
}
