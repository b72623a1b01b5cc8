//! `rail_allreduce` over ranks as threads of this test, each rank with two
//! or three rails, each rail an in-memory mailbox of its own (buffered
//! sends, like UCX's): the results against a sequential reduction and bit
//! for bit the same on every rank, over every element type and op, and
//! every rail carrying its part. The same for `threaded_rail_allreduce`
//! (two rails, the second on a `RailThread`), whose rail's failure or
//! panic is the call's error and whose thread ends when it is dropped.

use half::{bf16, f16};
use kolo_protocol::ReduceOp;
use kolo_transport::algorithms::{rail_allreduce, rail_parts, threaded_rail_allreduce, RailThread};
use kolo_transport::byte_view::{as_bytes, copy_from_bytes};
use kolo_transport::{Collectives, Element, Result, Scale, Topology, TransportError};
use proptest::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long a receive waits before the test fails instead of hanging.
const RECV_BOUND: Duration = Duration::from_secs(30);

/// Messages in flight by (source, destination, tag), in the order sent.
type Queues = HashMap<(usize, usize, u32), VecDeque<Vec<u8>>>;

/// One rail's messages in flight, and the bytes it carried.
#[derive(Default)]
struct Mailbox {
    queues: Mutex<Queues>,
    arrived: Condvar,
    bytes: AtomicUsize,
}

struct Rail {
    rank: usize,
    size: usize,
    mailbox: Arc<Mailbox>,
    /// What its sends do instead of sending, where set.
    fault: Option<Fault>,
    /// Set when the rail is dropped.
    dropped: Arc<AtomicBool>,
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Error,
    Panic,
}

impl Rail {
    fn new(rank: usize, size: usize, mailbox: &Arc<Mailbox>) -> Rail {
        Rail {
            rank,
            size,
            mailbox: Arc::clone(mailbox),
            fault: None,
            dropped: Arc::default(),
        }
    }
}

impl Drop for Rail {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
    }
}

impl Topology for Rail {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn local_rank(&self) -> usize {
        self.rank
    }
    fn local_size(&self) -> usize {
        self.size
    }
}

impl Collectives for Rail {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        if peer >= self.size {
            return Err(TransportError::InvalidArgument(format!("peer {peer}")));
        }
        match self.fault {
            Some(Fault::Error) => return Err(TransportError::Backend("injected failure".into())),
            Some(Fault::Panic) => panic!("injected panic"),
            None => {}
        }
        let bytes = as_bytes(buf).to_vec();
        self.mailbox.bytes.fetch_add(bytes.len(), Ordering::Relaxed);
        let mut queues = self.mailbox.queues.lock().unwrap();
        queues
            .entry((self.rank, peer, tag))
            .or_default()
            .push_back(bytes);
        self.mailbox.arrived.notify_all();
        Ok(())
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        if peer >= self.size {
            return Err(TransportError::InvalidArgument(format!("peer {peer}")));
        }
        let key = (peer, self.rank, tag);
        let mut queues = self.mailbox.queues.lock().unwrap();
        loop {
            if let Some(bytes) = queues.get_mut(&key).and_then(VecDeque::pop_front) {
                return copy_from_bytes(buf, &bytes);
            }
            let (next, waited) = self
                .mailbox
                .arrived
                .wait_timeout(queues, RECV_BOUND)
                .unwrap();
            queues = next;
            if waited.timed_out() {
                return Err(TransportError::Timeout(format!(
                    "rank {} waiting for rank {peer}, tag {tag:#x}",
                    self.rank
                )));
            }
        }
    }
}

/// Runs `body` on one thread per rank of `n`, each with `rails` rails;
/// the results in rank order and the bytes each rail carried.
fn run<R: Send>(
    n: usize,
    rails: usize,
    body: impl Fn(&mut [Rail]) -> R + Sync,
) -> (Vec<R>, Vec<usize>) {
    let mailboxes: Vec<Arc<Mailbox>> = (0..rails).map(|_| Arc::default()).collect();
    let results = std::thread::scope(|s| {
        let threads: Vec<_> = (0..n)
            .map(|rank| {
                let mut mine: Vec<Rail> = mailboxes
                    .iter()
                    .map(|mailbox| Rail::new(rank, n, mailbox))
                    .collect();
                let body = &body;
                s.spawn(move || body(&mut mine))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank panicked"))
            .collect()
    });
    let carried = mailboxes
        .iter()
        .map(|m| m.bytes.load(Ordering::Relaxed))
        .collect();
    (results, carried)
}

/// Rank `r`'s input: small integers (exact in every type and any order
/// of a sum), with negatives where the type has them, and few non-ones
/// for products.
fn input<T: Element>(rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let signed = T::from_f64(-1.0).to_f64() < 0.0;
    (0..len)
        .map(|i| {
            let v = ((i * 7 + rank * 13) % 5) as f64;
            let v = match op {
                ReduceOp::Product => 1.0 + f64::from(i % 3 == rank % 3),
                _ if signed => v - 2.0,
                _ => v,
            };
            T::from_f64(v)
        })
        .collect()
}

/// The reduction done in order on one thread, with the same kernels.
fn expected<T: Element>(n: usize, len: usize, op: ReduceOp, scale: Scale) -> Vec<T> {
    let mut acc = vec![T::identity(op); len];
    for r in 0..n {
        let mut x = input::<T>(r, len, op);
        T::scale(&mut x, scale.prescale);
        T::reduce_into(&mut acc, &x, op);
    }
    T::scale(&mut acc, scale.postscale_for(op, n));
    acc
}

/// A rank's allreduce over its rails: [`rail_allreduce`], or
/// [`threaded_rail_allreduce`] with the second rail on its thread.
fn reduce<T: Element>(
    mine: &mut [Rail],
    buf: &mut [T],
    op: ReduceOp,
    threaded: bool,
) -> Result<()> {
    if !threaded {
        return rail_allreduce(mine, buf, op, Scale::NONE);
    }
    let second = Rail::new(mine[1].rank, mine[1].size, &mine[1].mailbox);
    let mut thread = RailThread::start(second, Duration::from_micros(50)).expect("a thread");
    threaded_rail_allreduce(&mut mine[0], &mut thread, buf, op, Scale::NONE)
}

/// Every rank of `n` with `rails` rails (two where `threaded`) ends with
/// the sequential result, bitwise the same on all of them; the bytes each
/// rail carried.
fn check<T: Element>(
    n: usize,
    rails: usize,
    len: usize,
    op: ReduceOp,
    threaded: bool,
) -> Vec<usize> {
    let scale = Scale::NONE;
    let (results, carried) = run(n, rails, |mine| {
        let mut buf = input::<T>(mine[0].rank(), len, op);
        reduce(mine, &mut buf, op, threaded).map(|()| buf)
    });
    let want = expected::<T>(n, len, op, scale);
    let want_bytes = as_bytes(&want).to_vec();
    for (rank, got) in results.into_iter().enumerate() {
        let got = got.unwrap_or_else(|e| panic!("rank {rank} of {n}, {len} {op:?}: {e}"));
        assert!(
            as_bytes(&got) == want_bytes.as_slice(),
            "rank {rank} of {n}, {rails} rails (threaded: {threaded}), {len} elements of {:?}, {op:?}",
            T::DTYPE
        );
    }
    carried
}

/// Every element type at `len` elements, with the ops it takes.
fn every_type(n: usize, rails: usize, len: usize, op: ReduceOp, threaded: bool) {
    check::<f32>(n, rails, len, op, threaded);
    check::<f64>(n, rails, len, op, threaded);
    check::<f16>(n, rails, len, op, threaded);
    check::<bf16>(n, rails, len, op, threaded);
    check::<i8>(n, rails, len, op, threaded);
    check::<u8>(n, rails, len, op, threaded);
    check::<i16>(n, rails, len, op, threaded);
    check::<u16>(n, rails, len, op, threaded);
    check::<i32>(n, rails, len, op, threaded);
    check::<i64>(n, rails, len, op, threaded);
    if matches!(op, ReduceOp::Min | ReduceOp::Max) {
        check::<bool>(n, rails, len, op, threaded);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any number of ranks up to 8, two or three rails, lengths shorter
    /// than the ranks, odd, and past the short allreduce (recursive
    /// doubling) into the ring.
    #[test]
    fn every_type_and_op_matches_a_sequential_reduction(
        n in 1usize..=8,
        rails in 2usize..=3,
        len in prop_oneof![0usize..20, 20usize..3000, 9000usize..40_000],
        op in prop::sample::select(vec![
            ReduceOp::Sum, ReduceOp::Average, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product,
        ]),
    ) {
        every_type(n, rails, len, op, false);
    }

    /// The same with the second of two rails on its thread.
    #[test]
    fn threaded_every_type_and_op_matches_a_sequential_reduction(
        n in 1usize..=8,
        len in prop_oneof![0usize..20, 20usize..3000, 9000usize..40_000],
        op in prop::sample::select(vec![
            ReduceOp::Sum, ReduceOp::Average, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product,
        ]),
    ) {
        every_type(n, 2, len, op, true);
    }
}

#[test]
fn every_rail_carries_its_part() {
    let len = 100_001;
    let parts = rail_parts(len, 4, 2);
    for threaded in [false, true] {
        let carried = check::<f32>(4, 2, len, ReduceOp::Sum, threaded);
        // A ring moves 2 (n - 1) / n of each part from every one of n ranks.
        for (rail, part) in parts.iter().enumerate() {
            assert_eq!(carried[rail], 2 * 3 * part.len() * 4, "rail {rail}");
        }
    }
}

/// The threaded allreduce of 3 ranks whose second rails all fail with
/// `fault`: every rank's call returns an error, without a hang.
fn threaded_with_fault(fault: Fault) -> Vec<Result<()>> {
    let (results, _) = run(3, 2, |mine| {
        let mut second = Rail::new(mine[1].rank, mine[1].size, &mine[1].mailbox);
        second.fault = Some(fault);
        let mut thread = RailThread::start(second, Duration::ZERO).expect("a thread");
        let mut buf = vec![1.0f32; 100_000];
        let first = threaded_rail_allreduce(
            &mut mine[0],
            &mut thread,
            &mut buf,
            ReduceOp::Sum,
            Scale::NONE,
        );
        // The rail's thread still serves after a failure.
        let again = threaded_rail_allreduce(
            &mut mine[0],
            &mut thread,
            &mut buf,
            ReduceOp::Sum,
            Scale::NONE,
        );
        first.and(
            again
                .map_err(|e| TransportError::Backend(format!("again: {e}")))
                .and(Ok(())),
        )
    });
    results
}

#[test]
fn a_failing_rail_is_the_calls_error() {
    for got in threaded_with_fault(Fault::Error) {
        let err = got.unwrap_err();
        assert!(err.to_string().contains("injected failure"), "{err}");
    }
}

#[test]
fn a_panic_on_the_rails_thread_is_the_calls_error() {
    for got in threaded_with_fault(Fault::Panic) {
        let err = got.unwrap_err();
        assert!(
            err.to_string()
                .contains("the rail's thread panicked: injected panic"),
            "{err}"
        );
    }
}

#[test]
fn the_rails_thread_ends_when_dropped() {
    let mailbox = Arc::default();
    let rail = Rail::new(0, 1, &mailbox);
    let dropped = Arc::clone(&rail.dropped);
    let mut thread = RailThread::start(rail, Duration::from_micros(50)).expect("a thread");
    let mut first = Rail::new(0, 1, &mailbox);
    let mut buf = vec![2.0f32; 1000];
    threaded_rail_allreduce(
        &mut first,
        &mut thread,
        &mut buf,
        ReduceOp::Sum,
        Scale::NONE,
    )
    .expect("one rank's allreduce");
    assert!(buf.iter().all(|&x| x == 2.0));
    assert!(!dropped.load(Ordering::Acquire));
    drop(thread);
    // The rail came back from its ended thread and was dropped.
    assert!(dropped.load(Ordering::Acquire));
}

#[test]
fn a_rail_of_another_communicator_is_refused() {
    let (results, _) = run(2, 2, |mine| {
        mine[1].rank = 1 - mine[1].rank;
        let mut buf = vec![1.0f32; 64];
        let scoped = rail_allreduce(mine, &mut buf, ReduceOp::Sum, Scale::NONE);
        let other = Rail::new(mine[1].rank, mine[1].size, &mine[1].mailbox);
        let mut thread = RailThread::start(other, Duration::ZERO).expect("a thread");
        let threaded = threaded_rail_allreduce(
            &mut mine[0],
            &mut thread,
            &mut buf,
            ReduceOp::Sum,
            Scale::NONE,
        );
        [scoped, threaded]
    });
    for got in results.into_iter().flatten() {
        let err = got.unwrap_err();
        assert!(err.to_string().contains("a rail of rank"), "{err}");
    }
    let err =
        rail_allreduce::<Rail, f32>(&mut [], &mut [1.0], ReduceOp::Sum, Scale::NONE).unwrap_err();
    assert!(err.to_string().contains("no rail"), "{err}");
}
