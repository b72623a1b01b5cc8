//! A rail on a persistent thread of its own ([`RailThread`]), and the
//! allreduce over a communicator and such a rail
//! ([`threaded_rail_allreduce`]): the calling thread reduces the first
//! part of the buffer over its communicator while the rail's thread
//! reduces the second over the rail, as [`super::rail_allreduce`] does
//! with a thread started per call, without that start.
//!
//! A part is handed over through one slot and a state word: the rail's
//! thread and the caller each poll the word for a while before they park
//! (a futex wake costs tens of microseconds on a virtual machine, as much
//! as a ring step of a megabyte's part), so back-to-back allreduces never
//! sleep on either side. They yield the CPU between polls: with a core
//! free that returns at once, and where the cores are all taken (ranks in
//! network namespaces of one host, which look like hosts of their own) a
//! polling thread does not keep the one it waits for off the CPU.

use super::rails::rail_parts;
use crate::element::Element;
use crate::error::{Result, TransportError};
use crate::traits::{Collectives, Scale};
use kolo_protocol::ReduceOp;
use std::any::Any;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// The slot holds no part: the last one's outcome, if any, is there.
const READY: u8 = 0;
/// A part waits in the slot, or the rail's thread is reducing it.
const SUBMITTED: u8 = 1;
/// The rail's thread is asked to end.
const STOP: u8 = 2;
/// The rail's thread ended (it hands its rail back through its join).
const ENDED: u8 = 3;

/// How long dropping a [`RailThread`] waits for its thread to end; past
/// it the thread is left detached (it is idle, so only a thread that
/// cannot be scheduled takes that long).
const STOP_BOUND: Duration = Duration::from_secs(10);

/// Polls between two looks at the clock while polling the state.
const POLLS_PER_CLOCK: u32 = 64;

/// Reduces the part `ptr`, `len` (elements of the type it was made for)
/// over the rail.
type RunPart<C> = unsafe fn(&mut C, *mut u8, usize, ReduceOp, Scale) -> Result<()>;

/// A part of a caller's buffer for the rail's thread.
struct Part<C> {
    run: RunPart<C>,
    ptr: *mut u8,
    len: usize,
    op: ReduceOp,
    scale: Scale,
}

// SAFETY: a part names elements of an `Element` type (`Send`) that the
// submitting call borrows exclusively and does not touch until the rail's
// thread reported the part's end (see `Pending`); the rail's thread is
// the only one to use them meanwhile.
unsafe impl<C> Send for Part<C> {}

/// What the caller and the rail's thread hand each other.
struct Slot<C> {
    part: Option<Part<C>>,
    outcome: Option<Result<()>>,
    /// The thread to unpark when the part ended (or the rail's thread did).
    waiter: Option<Thread>,
}

struct Handoff<C> {
    state: AtomicU8,
    slot: Mutex<Slot<C>>,
    /// How long either side polls `state` before it parks.
    spin: Duration,
}

impl<C> Handoff<C> {
    fn slot(&self) -> MutexGuard<'_, Slot<C>> {
        // Nothing panics while holding the lock; a poisoned slot is whole.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A rail (a communicator of the same ranks as the caller's, in the same
/// order, with its own connections) owned by a thread of its own, which
/// waits for parts of allreduces from [`threaded_rail_allreduce`] until
/// the `RailThread` is dropped. Dropping it ends the thread (waiting for
/// it up to 10 s) and drops the rail on the dropping thread.
pub struct RailThread<C: Collectives + Send + 'static> {
    handoff: Arc<Handoff<C>>,
    thread: Option<JoinHandle<C>>,
    rank: usize,
    size: usize,
}

impl<C: Collectives + Send + 'static> RailThread<C> {
    /// Starts the thread (named `kolo-rail`) that owns `rail`. Either side
    /// of a hand-off polls (yielding between polls) up to `spin` before it
    /// parks: zero where the host's cores are known to be all taken.
    pub fn start(rail: C, spin: Duration) -> std::io::Result<Self> {
        let (rank, size) = (rail.rank(), rail.size());
        let handoff = Arc::new(Handoff {
            state: AtomicU8::new(READY),
            slot: Mutex::new(Slot {
                part: None,
                outcome: None,
                waiter: None,
            }),
            spin,
        });
        let served = Arc::clone(&handoff);
        let thread = std::thread::Builder::new()
            .name("kolo-rail".into())
            .spawn(move || serve(rail, &served))?;
        Ok(RailThread {
            handoff,
            thread: Some(thread),
            rank,
            size,
        })
    }

    /// Hands `part` to the rail's thread; the returned guard waits for its
    /// end (when waited on or dropped), so `part` stays borrowed until the
    /// rail's thread is done with it. Private: a guard that was forgotten
    /// instead of dropped would end the borrow early.
    fn submit<'a, T: Element>(
        &'a mut self,
        part: &'a mut [T],
        op: ReduceOp,
        scale: Scale,
    ) -> Pending<'a, C> {
        {
            let mut slot = self.handoff.slot();
            slot.part = Some(Part {
                run: run_part::<C, T>,
                ptr: part.as_mut_ptr().cast(),
                len: part.len(),
                op,
                scale,
            });
            slot.outcome = None;
            slot.waiter = Some(std::thread::current());
        }
        self.handoff.state.store(SUBMITTED, Ordering::Release);
        if let Some(thread) = &self.thread {
            // A mere flag unless the rail's thread is parked.
            thread.thread().unpark();
        }
        Pending {
            handoff: &self.handoff,
            done: false,
            _part: PhantomData,
        }
    }
}

impl<C: Collectives + Send + 'static> std::fmt::Debug for RailThread<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RailThread")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("spin", &self.handoff.spin)
            .finish_non_exhaustive()
    }
}

impl<C: Collectives + Send + 'static> Drop for RailThread<C> {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        // No part is in flight: a submission holds `self` until it ended.
        self.handoff.slot().waiter = Some(std::thread::current());
        self.handoff.state.store(STOP, Ordering::Release);
        thread.thread().unpark();
        let deadline = Instant::now() + STOP_BOUND;
        loop {
            if self.handoff.state.load(Ordering::Acquire) == ENDED || thread.is_finished() {
                // The rail comes back and is dropped here.
                let _ = thread.join();
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            std::thread::park_timeout(deadline - now);
        }
    }
}

/// The end of a submitted part: waits for the rail's thread to report it,
/// when [`Pending::wait`]ed on or dropped (an unwinding caller too).
struct Pending<'a, C> {
    handoff: &'a Handoff<C>,
    done: bool,
    /// The part stays borrowed, exclusively, as long as this lives.
    _part: PhantomData<&'a mut [u8]>,
}

impl<C> Pending<'_, C> {
    /// The part's outcome, once the rail's thread reported it.
    fn wait(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        wait_while(&self.handoff.state, SUBMITTED, self.handoff.spin);
        self.done = true;
        self.handoff.slot().outcome.take().unwrap_or_else(|| {
            Err(TransportError::Backend(
                "rail allreduce: the rail's thread reported no outcome".into(),
            ))
        })
    }
}

impl<C> Drop for Pending<'_, C> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.finish();
        }
    }
}

/// The rail's thread: serves parts until asked to stop, then hands the
/// rail back.
fn serve<C: Collectives>(mut rail: C, handoff: &Handoff<C>) -> C {
    loop {
        let state = wait_while(&handoff.state, READY, handoff.spin);
        let (part, waiter) = {
            let mut slot = handoff.slot();
            (slot.part.take(), slot.waiter.take())
        };
        if state != SUBMITTED {
            handoff.state.store(ENDED, Ordering::Release);
            if let Some(waiter) = waiter {
                waiter.unpark();
            }
            return rail;
        }
        let outcome = match part {
            Some(part) => catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: the part was made by `submit` from a `&mut [T]`
                // for `run_part::<C, T>`, and its submitter waits for this
                // outcome before the borrow ends (see `Pending`).
                unsafe { (part.run)(&mut rail, part.ptr, part.len, part.op, part.scale) }
            }))
            .unwrap_or_else(|panic| {
                Err(TransportError::Backend(format!(
                    "rail allreduce: the rail's thread panicked: {}",
                    panic_message(&*panic)
                )))
            }),
            None => Err(TransportError::Backend(
                "rail allreduce: the rail's thread found no part".into(),
            )),
        };
        handoff.slot().outcome = Some(outcome);
        handoff.state.store(READY, Ordering::Release);
        if let Some(waiter) = waiter {
            waiter.unpark();
        }
    }
}

/// Reduces the part over `rail`.
///
/// # Safety
/// `ptr` and `len` name `len` initialized elements of `T`, valid and used
/// by nothing else until this returns.
unsafe fn run_part<C: Collectives, T: Element>(
    rail: &mut C,
    ptr: *mut u8,
    len: usize,
    op: ReduceOp,
    scale: Scale,
) -> Result<()> {
    let part = if len == 0 {
        &mut []
    } else {
        // SAFETY: the caller's contract: `len` live `T`s at `ptr`, aligned
        // (they came from a `&mut [T]`), used by nothing else meanwhile.
        unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>(), len) }
    };
    super::allreduce(rail, part, op, scale)
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Waits until `state` is no longer `current`, polling it (and yielding
/// the CPU between polls) up to `spin` before parking (the other side
/// unparks this thread after each change); the new state.
fn wait_while(state: &AtomicU8, current: u8, spin: Duration) -> u8 {
    let started = (!spin.is_zero()).then(Instant::now);
    let mut polls = 0u32;
    loop {
        let now = state.load(Ordering::Acquire);
        if now != current {
            return now;
        }
        match started {
            Some(at) if polls < POLLS_PER_CLOCK || at.elapsed() < spin => {
                polls = polls % POLLS_PER_CLOCK + 1;
                std::thread::yield_now();
            }
            _ => std::thread::park(),
        }
    }
}

/// In place, as [`super::allreduce`], over `first` on the calling thread
/// and `rail`'s communicator on its thread: the first part of `buf` (see
/// [`rail_parts`], two parts) over `first`, the second over the rail, so
/// every rank ends with bitwise the same values. Every rank passes the
/// same length. The first error of the two is returned, after both parts
/// ended: a rail's failure (a lost peer, an interrupted wait) or a panic
/// on its thread is an error of the call. The call waits for the rail's
/// part as long as the rail's own waits take.
pub fn threaded_rail_allreduce<F, C, T>(
    first: &mut F,
    rail: &mut RailThread<C>,
    buf: &mut [T],
    op: ReduceOp,
    scale: Scale,
) -> Result<()>
where
    F: Collectives,
    C: Collectives + Send + 'static,
    T: Element,
{
    if (rail.rank, rail.size) != (first.rank(), first.size()) {
        return Err(TransportError::InvalidArgument(format!(
            "rail allreduce: a rail of rank {} of {} beside one of rank {} of {}",
            rail.rank,
            rail.size,
            first.rank(),
            first.size()
        )));
    }
    let parts = rail_parts(buf.len(), std::mem::size_of::<T>(), 2);
    let (mine, theirs) = buf.split_at_mut(parts[0].len());
    let pending = rail.submit(theirs, op, scale);
    let here = super::allreduce(first, mine, op, scale);
    let there = pending.wait();
    here.and(there)
}
