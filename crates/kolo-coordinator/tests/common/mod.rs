//! A fake in-memory [`Controller`] for tests: every collective is one
//! rendezvous of all rank threads over a mutex and condvar, with a timeout
//! so that a test whose ranks diverge fails instead of hanging.

#![allow(dead_code)] // each test binary uses a different part

use kolo_coordinator::{Coordinator, CoordinatorConfig, CycleOutput};
use kolo_protocol::{DataType, ReduceOp, Request, RequestKind, Response};
use kolo_transport::{BitOp, Controller, Result, Topology, TransportError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Default)]
struct Rendezvous {
    generation: u64,
    arrived: usize,
    slots: Vec<Vec<u8>>,
    result: Arc<Vec<Vec<u8>>>,
}

struct Shared {
    size: usize,
    state: Mutex<Rendezvous>,
    wake: Condvar,
}

/// One rank's handle on the fake control plane.
pub struct FakeController {
    rank: usize,
    shared: Arc<Shared>,
    /// Replace this rank's gathered messages with bytes that do not decode.
    pub corrupt_gather: bool,
    /// Number of `bitwise_allreduce` calls made.
    pub bitwise_calls: usize,
    /// The words of the last `bitwise_allreduce`.
    pub bitwise_words: usize,
    /// Number of `gather_bytes` calls made.
    pub gather_calls: usize,
}

/// Controllers for `size` ranks.
pub fn world(size: usize) -> Vec<FakeController> {
    let shared = Arc::new(Shared {
        size,
        state: Mutex::new(Rendezvous {
            slots: vec![Vec::new(); size],
            ..Rendezvous::default()
        }),
        wake: Condvar::new(),
    });
    (0..size)
        .map(|rank| FakeController {
            rank,
            shared: shared.clone(),
            corrupt_gather: false,
            bitwise_calls: 0,
            bitwise_words: 0,
            gather_calls: 0,
        })
        .collect()
}

impl FakeController {
    /// Every rank's `msg`, in rank order.
    fn exchange(&mut self, msg: &[u8]) -> Result<Arc<Vec<Vec<u8>>>> {
        let shared = &self.shared;
        let poisoned = || TransportError::Backend("fake controller lock poisoned".into());
        let mut st = shared.state.lock().map_err(|_| poisoned())?;
        let generation = st.generation;
        st.slots[self.rank] = msg.to_vec();
        st.arrived += 1;
        if st.arrived == shared.size {
            let slots = std::mem::replace(&mut st.slots, vec![Vec::new(); shared.size]);
            st.result = Arc::new(slots);
            st.arrived = 0;
            st.generation += 1;
            shared.wake.notify_all();
            return Ok(st.result.clone());
        }
        let deadline = Instant::now() + TIMEOUT;
        while st.generation == generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TransportError::Timeout(format!(
                    "rank {} waited for its peers",
                    self.rank
                )));
            }
            st = shared
                .wake
                .wait_timeout(st, left)
                .map_err(|_| poisoned())?
                .0;
        }
        Ok(st.result.clone())
    }
}

impl Topology for FakeController {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn local_rank(&self) -> usize {
        self.rank
    }
    fn local_size(&self) -> usize {
        self.shared.size
    }
}

impl Controller for FakeController {
    fn gather_bytes(&mut self, msg: &[u8], root: usize) -> Result<Option<Vec<Vec<u8>>>> {
        self.gather_calls += 1;
        let msg = if self.corrupt_gather {
            &b"not a request list"[..]
        } else {
            msg
        };
        let all = self.exchange(msg)?;
        Ok((self.rank == root).then(|| all.to_vec()))
    }

    fn broadcast_bytes(&mut self, msg: &[u8], root: usize) -> Result<Vec<u8>> {
        Ok(self.exchange(msg)?[root].clone())
    }

    fn allgather_bytes(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(self.exchange(msg)?.to_vec())
    }

    fn control_barrier(&mut self) -> Result<()> {
        self.exchange(&[]).map(drop)
    }

    fn bitwise_allreduce(&mut self, words: &mut [u64], op: BitOp) -> Result<()> {
        self.bitwise_calls += 1;
        self.bitwise_words = words.len();
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let all = self.exchange(&bytes)?;
        for (rank, other) in all.iter().enumerate() {
            if other.len() != bytes.len() {
                return Err(TransportError::InvalidArgument(format!(
                    "rank {rank} passed {} bytes, rank {} passed {}",
                    other.len(),
                    self.rank,
                    bytes.len()
                )));
            }
            for (word, chunk) in words.iter_mut().zip(other.chunks_exact(8)) {
                let mut le = [0u8; 8];
                le.copy_from_slice(chunk);
                let value = u64::from_le_bytes(le);
                match op {
                    BitOp::And => *word &= value,
                    BitOp::Or => *word |= value,
                }
            }
        }
        Ok(())
    }
}

/// Runs `body` on one thread per rank with that rank's coordinator and
/// controller; returns the results in rank order.
pub fn run_ranks<T: Send>(
    size: usize,
    config: &CoordinatorConfig,
    body: impl Fn(usize, &mut Coordinator, &mut FakeController) -> T + Sync,
) -> Vec<T> {
    let body = &body;
    std::thread::scope(|scope| {
        let handles: Vec<_> = world(size)
            .into_iter()
            .enumerate()
            .map(|(rank, mut ctrl)| {
                let mut coordinator = Coordinator::new(rank, size, config.clone());
                scope.spawn(move || body(rank, &mut coordinator, &mut ctrl))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// Runs cycles (with no new requests after the first) until `count`
/// responses arrived or `max_cycles` ran; every rank stops at the same cycle
/// because every rank gets the same responses.
pub fn cycle_until(
    coordinator: &mut Coordinator,
    ctrl: &mut FakeController,
    first: Vec<Request>,
    count: usize,
    max_cycles: usize,
) -> Vec<CycleOutput> {
    let mut outputs = Vec::new();
    let mut requests = first;
    let mut got = 0;
    for _ in 0..max_cycles {
        let out = coordinator
            .cycle_requests(ctrl, std::mem::take(&mut requests), false, Instant::now())
            .unwrap_or_else(|e| panic!("cycle failed: {e}"));
        got += out.responses.len();
        outputs.push(out);
        if got >= count {
            break;
        }
    }
    outputs
}

/// A configuration without stall handling.
pub fn config(cache_capacity: usize) -> CoordinatorConfig {
    CoordinatorConfig {
        cache_capacity,
        stall_warning: None,
        stall_shutdown: None,
        events: true,
    }
}

/// An allreduce request.
pub fn allreduce(rank: usize, name: &str, len: u64, op: ReduceOp) -> Request {
    Request {
        reduce_op: op,
        ..Request::new(
            rank as u32,
            name,
            RequestKind::Allreduce,
            DataType::F32,
            vec![len],
        )
    }
}

/// A join request.
pub fn join(rank: usize, name: &str) -> Request {
    Request::new(
        rank as u32,
        name,
        RequestKind::Join,
        DataType::U8,
        Vec::new(),
    )
}

/// The single name of a response.
pub fn name_of(response: &Response) -> &str {
    response.tensor_names.first().map_or("", String::as_str)
}
