//! `hierarchical_allreduce` and `Subset` over ranks as threads of this
//! test, joined by an in-memory mailbox (buffered sends, like UCX's), with
//! host layouts made up for each case: the results against a sequential
//! reduction, bit for bit, and the bytes that cross hosts against the flat
//! ring's.

use kolo_protocol::ReduceOp;
use kolo_transport::algorithms::{hierarchical_allreduce, HostLayout, Subset};
use kolo_transport::byte_view::{as_bytes, copy_from_bytes};
use kolo_transport::{Collectives, Element, Result, Scale, Topology, TransportError};
use proptest::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How long a receive waits before the test fails instead of hanging.
const RECV_BOUND: Duration = Duration::from_secs(30);

/// Messages in flight by (source, destination, tag), in the order sent.
type Queues = HashMap<(usize, usize, u32), VecDeque<Vec<u8>>>;

/// The messages in flight, and the bytes sent between ranks on different
/// hosts.
#[derive(Default)]
struct Mailbox {
    queues: Mutex<Queues>,
    arrived: Condvar,
    across_hosts: AtomicUsize,
}

struct Rank {
    rank: usize,
    hosts: Arc<Vec<u64>>,
    mailbox: Arc<Mailbox>,
}

impl Topology for Rank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.hosts.len()
    }
    fn local_rank(&self) -> usize {
        let me = self.hosts[self.rank];
        self.hosts[..self.rank].iter().filter(|&&h| h == me).count()
    }
    fn local_size(&self) -> usize {
        let me = self.hosts[self.rank];
        self.hosts.iter().filter(|&&h| h == me).count()
    }
}

impl Collectives for Rank {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        if peer >= self.size() {
            return Err(TransportError::InvalidArgument(format!("peer {peer}")));
        }
        let bytes = as_bytes(buf).to_vec();
        if self.hosts[peer] != self.hosts[self.rank] {
            self.mailbox
                .across_hosts
                .fetch_add(bytes.len(), Ordering::Relaxed);
        }
        let mut queues = self.mailbox.queues.lock().unwrap();
        queues
            .entry((self.rank, peer, tag))
            .or_default()
            .push_back(bytes);
        self.mailbox.arrived.notify_all();
        Ok(())
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        if peer >= self.size() {
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

/// Runs `body` on one thread per rank of `hosts`; its results in rank
/// order and the bytes that crossed hosts.
fn run<R: Send>(hosts: &[u64], body: impl Fn(&mut Rank) -> R + Sync) -> (Vec<R>, usize) {
    let hosts = Arc::new(hosts.to_vec());
    let mailbox = Arc::new(Mailbox::default());
    let results = std::thread::scope(|s| {
        let threads: Vec<_> = (0..hosts.len())
            .map(|rank| {
                let mut comm = Rank {
                    rank,
                    hosts: Arc::clone(&hosts),
                    mailbox: Arc::clone(&mailbox),
                };
                let body = &body;
                s.spawn(move || body(&mut comm))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank panicked"))
            .collect()
    });
    (results, mailbox.across_hosts.load(Ordering::Relaxed))
}

/// Rank `r`'s input: small integers, so that float sums are exact in any
/// order, with negatives for min and max.
fn input<T: Element + From<i8>>(rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    (0..len)
        .map(|i| {
            let v = ((i * 7 + rank * 13) % 11) as i8 - 5;
            T::from(if op == ReduceOp::Product { v % 3 } else { v })
        })
        .collect()
}

/// The reduction done in order on one thread, with the same scaling
/// kernels.
fn expected<T: Element + From<i8>>(n: usize, len: usize, op: ReduceOp, scale: Scale) -> Vec<T> {
    let mut acc = vec![T::identity(op); len];
    for r in 0..n {
        let mut x = input::<T>(r, len, op);
        T::scale(&mut x, scale.prescale);
        T::reduce_into(&mut acc, &x, op);
    }
    T::scale(&mut acc, scale.postscale_for(op, n));
    acc
}

/// Every rank of `hosts` ends with the sequential result.
fn check<T: Element + From<i8>>(hosts: &[u64], len: usize, op: ReduceOp, scale: Scale) {
    let (results, _) = run(hosts, |comm| {
        let layout = HostLayout::new(hosts, comm.rank())?;
        let mut buf = input::<T>(comm.rank(), len, op);
        hierarchical_allreduce(comm, &layout, &mut buf, op, scale)?;
        Ok::<_, TransportError>(buf)
    });
    let want = expected::<T>(hosts.len(), len, op, scale);
    for (rank, got) in results.into_iter().enumerate() {
        let got = got.unwrap_or_else(|e| panic!("rank {rank} of {hosts:?}, {len} {op:?}: {e}"));
        assert!(
            got == want,
            "rank {rank} of hosts {hosts:?}, {len} elements of {:?}, {op:?}",
            T::DTYPE
        );
    }
}

const LAYOUTS: [&[u64]; 8] = [
    &[0, 0, 1, 1],
    &[0, 0, 0, 1, 1, 1],
    &[0, 0, 1, 1, 2, 2],
    &[4, 9, 4, 9],
    &[0, 0, 0, 1],
    &[0, 0, 0],
    &[0, 1, 2],
    &[0],
];

#[test]
fn every_layout_length_and_op_matches_a_sequential_reduction() {
    let halved = Scale {
        prescale: 0.5,
        postscale: 2.0,
    };
    for hosts in LAYOUTS {
        // Shorter than the ranks, odd, and longer than a ring segment.
        for len in [0, 1, 2, 3, 5, 7, 64, 1001, 70_001] {
            for op in [ReduceOp::Sum, ReduceOp::Average] {
                check::<f32>(hosts, len, op, Scale::NONE);
                check::<i64>(hosts, len, op, Scale::NONE);
            }
        }
        for op in [ReduceOp::Min, ReduceOp::Max, ReduceOp::Product] {
            check::<f32>(hosts, 37, op, Scale::NONE);
            check::<i32>(hosts, 37, op, Scale::NONE);
        }
        check::<f64>(hosts, 1003, ReduceOp::Average, halved);
        check::<i64>(hosts, 1003, ReduceOp::Sum, halved);
    }
}

#[test]
fn long_buffers_go_through_the_pipeline_in_chunks() {
    // 3, 6 and (at most) 16 chunks of about 1 MiB.
    for hosts in [
        &[0, 0, 1, 1][..],
        &[0, 0, 0, 1, 1, 1],
        &[0, 1, 0, 1, 0, 1, 0, 1],
    ] {
        check::<f32>(hosts, 800_001, ReduceOp::Average, Scale::NONE);
        check::<i64>(hosts, 800_001, ReduceOp::Sum, Scale::NONE);
    }
    check::<i64>(&[0, 0, 1, 1], 2_500_003, ReduceOp::Sum, Scale::NONE);
}

#[test]
fn only_the_shares_cross_hosts() {
    let hosts = [0, 0, 1, 1];
    let len = 1 << 16;
    let traffic = |hierarchical: bool| {
        run(&hosts, |comm| {
            let layout = HostLayout::new(&hosts, comm.rank()).unwrap();
            let mut buf = vec![1.0f32; len];
            if hierarchical {
                hierarchical_allreduce(comm, &layout, &mut buf, ReduceOp::Sum, Scale::NONE)
            } else {
                comm.allreduce(&mut buf[..], ReduceOp::Sum, Scale::NONE)
            }
        })
        .1
    };
    let bytes = len * 4;
    // Each rank sends its half share across once: half of it in the
    // reduce-scatter, half in the allgather.
    assert_eq!(traffic(true), 2 * bytes);
    // The flat ring's two edges between the hosts carry 2 (n - 1) / n each.
    assert_eq!(traffic(false), 3 * bytes);
}

#[test]
fn consecutive_calls_of_both_kinds_do_not_mix_their_messages() {
    let hosts = [0, 0, 1, 1, 2, 2];
    let (results, _) = run(&hosts, |comm| {
        let layout = HostLayout::new(&hosts, comm.rank())?;
        let mut out = Vec::new();
        for round in 0..6usize {
            let mut buf = vec![(comm.rank() + round) as i64; 999 + round];
            if round % 3 == 2 {
                comm.allreduce(&mut buf[..], ReduceOp::Sum, Scale::NONE)?;
            } else {
                hierarchical_allreduce(comm, &layout, &mut buf, ReduceOp::Sum, Scale::NONE)?;
            }
            out.push(buf);
        }
        Ok::<_, TransportError>(out)
    });
    for (rank, got) in results.into_iter().enumerate() {
        let got = got.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        for (round, buf) in got.iter().enumerate() {
            let want = (0..6).map(|r| (r + round) as i64).sum::<i64>();
            assert_eq!(buf, &vec![want; 999 + round], "rank {rank}, round {round}");
        }
    }
}

#[test]
fn a_layout_of_another_communicator_is_refused() {
    let (results, _) = run(&[0, 0], |comm| {
        let layout = HostLayout::new(&[0, 0, 1, 1], comm.rank())?;
        hierarchical_allreduce(comm, &layout, &mut [1u8; 4], ReduceOp::Sum, Scale::NONE)
    });
    for result in results {
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("the host layout of rank 0 of 4 on rank 0 of 2")
                || err.contains("the host layout of rank 1 of 4 on rank 1 of 2"),
            "{err}"
        );
    }
}

#[test]
fn a_subset_runs_the_generic_collectives_among_its_members() {
    let hosts = [0, 0, 1, 1, 1];
    let members = [4, 1, 3];
    let (results, _) = run(&hosts, |comm| {
        if !members.contains(&comm.rank()) {
            return Ok(None);
        }
        let mut view = Subset::new(comm, &members, &hosts)?;
        let local = (view.local_rank(), view.local_size());
        let mut buf = vec![view.rank() as u16 + 1; 5];
        view.allreduce(&mut buf[..], ReduceOp::Sum, Scale::NONE)?;
        let mut gathered = vec![0u16; 3];
        view.allgatherv(&[view.rank() as u16], &mut gathered, &[1, 1, 1])?;
        Ok::<_, TransportError>(Some((view.rank(), local, buf, gathered)))
    });
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(results[0], None);
    assert_eq!(results[4], Some((0, (0, 2), vec![6; 5], vec![0, 1, 2])));
    assert_eq!(results[1], Some((1, (0, 1), vec![6; 5], vec![0, 1, 2])));
    assert_eq!(results[3], Some((2, (1, 2), vec![6; 5], vec![0, 1, 2])));
}

#[test]
fn a_subset_checks_its_members() {
    let (results, _) = run(&[0, 0, 0], |comm| {
        let hosts = [0, 0, 0];
        let errors = [
            Subset::new(&mut *comm, &[0, 3], &hosts).map(drop),
            Subset::new(&mut *comm, &[0, 1, 2, 0], &hosts).map(drop),
            Subset::new(&mut *comm, &[0, 1, 2], &hosts[..2]).map(drop),
        ];
        let outsider = Subset::new(&mut *comm, &[2], &hosts).map(drop);
        (errors.map(|e| e.unwrap_err().to_string()), outsider)
    });
    let (errors, outsider) = &results[1];
    assert!(
        errors[0].contains("member 3 is out of range"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("rank 0 is listed twice"),
        "{}",
        errors[1]
    );
    assert!(
        errors[2].contains("2 host keys for a communicator of 3 ranks"),
        "{}",
        errors[2]
    );
    assert!(outsider
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("rank 1 is not among"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Uniform layouts of up to 4 hosts of up to 4 ranks, ranks dealt to
    /// hosts in any order, any length.
    #[test]
    fn any_uniform_layout(hosts in 1usize..=4, per_host in 1usize..=4, seed in any::<u64>(), len in 0usize..300) {
        let mut keys: Vec<u64> = (0..hosts * per_host).map(|i| (i / per_host) as u64 * 31).collect();
        let mut state = seed | 1;
        for i in (1..keys.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            keys.swap(i, (state % (i as u64 + 1)) as usize);
        }
        check::<i64>(&keys, len, ReduceOp::Sum, Scale::NONE);
        check::<f32>(&keys, len, ReduceOp::Average, Scale::NONE);
    }
}
