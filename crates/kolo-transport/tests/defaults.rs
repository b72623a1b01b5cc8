//! The trait's default collectives (the generic algorithms) without a real
//! backend: argument checks on a communicator that must never communicate,
//! single-rank semantics on a loopback, and the `&mut C` / `Generic`
//! forwarding.

use kolo_protocol::ReduceOp;
use kolo_transport::byte_view::{as_bytes, copy_from_bytes};
use kolo_transport::{
    Collectives, Element, Generic, Result, Scale, Topology, Transaction, TransportError,
};
use std::collections::VecDeque;

/// Rank `rank` of `size`; any message is a test failure (`Backend` error),
/// so arguments must be rejected before communicating.
struct Silent {
    rank: usize,
    size: usize,
}

impl Topology for Silent {
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

impl Collectives for Silent {
    fn send<T: Element>(&mut self, _: &[T], peer: usize, _: u32) -> Result<()> {
        Err(TransportError::Backend(format!(
            "unexpected send to {peer}"
        )))
    }
    fn recv<T: Element>(&mut self, _: &mut [T], peer: usize, _: u32) -> Result<()> {
        Err(TransportError::Backend(format!(
            "unexpected recv from {peer}"
        )))
    }
}

fn invalid(result: Result<()>, want: &str) {
    match result {
        Err(TransportError::InvalidArgument(message)) => {
            assert!(
                message.contains(want),
                "{message:?} should contain {want:?}"
            )
        }
        other => panic!("expected InvalidArgument containing {want:?}, got {other:?}"),
    }
}

#[test]
fn allgatherv_checks_counts_and_lengths() {
    let mut comm = Silent { rank: 1, size: 4 };
    let mut recv = [0f32; 6];
    invalid(
        comm.allgatherv(&[1.0; 2], &mut recv, &[1, 2, 3]),
        "allgatherv: counts has 3 entries but the communicator has 4 ranks",
    );
    invalid(
        comm.allgatherv(&[1.0; 3], &mut recv, &[1, 2, 3, 0]),
        "allgatherv: send has 3 elements, expected 2",
    );
    invalid(
        comm.allgatherv(&[1.0; 2], &mut recv[..5], &[1, 2, 3, 0]),
        "allgatherv: recv has 5 elements, expected 6",
    );
    invalid(
        comm.allgatherv(&[1.0; 2], &mut recv, &[usize::MAX, 2, 3, 0]),
        "overflows",
    );
}

#[test]
fn reduce_scatter_checks_counts_and_lengths() {
    let mut comm = Silent { rank: 2, size: 3 };
    let mut recv = [0i32; 4];
    let send = [0i32; 7];
    invalid(
        comm.reduce_scatter(&send, &mut recv, &[1, 2], ReduceOp::Sum, Scale::NONE),
        "reduce_scatter: counts has 2 entries but the communicator has 3 ranks",
    );
    invalid(
        comm.reduce_scatter(
            &send[..6],
            &mut recv,
            &[1, 2, 4],
            ReduceOp::Sum,
            Scale::NONE,
        ),
        "reduce_scatter: send has 6 elements, expected 7",
    );
    invalid(
        comm.reduce_scatter(
            &send,
            &mut recv[..3],
            &[1, 2, 4],
            ReduceOp::Max,
            Scale::NONE,
        ),
        "reduce_scatter: recv has 3 elements, expected 4",
    );
}

#[test]
fn broadcast_checks_the_root() {
    let mut comm = Silent { rank: 0, size: 4 };
    invalid(
        comm.broadcast(&mut [1u8; 3], 4),
        "broadcast: root 4 is out of range for a communicator of 4 ranks",
    );
}

#[test]
fn alltoallv_checks_counts_and_lengths() {
    let mut comm = Silent { rank: 1, size: 3 };
    let send = [0u16; 6];
    let mut recv = [0u16; 6];
    invalid(
        comm.alltoallv(&send, &[1, 2, 3, 0], &mut recv, &[2, 2, 2]),
        "alltoallv: send_counts has 4 entries but the communicator has 3 ranks",
    );
    invalid(
        comm.alltoallv(&send, &[1, 2, 3], &mut recv, &[2, 2]),
        "alltoallv: recv_counts has 2 entries but the communicator has 3 ranks",
    );
    invalid(
        comm.alltoallv(&send[..5], &[1, 2, 3], &mut recv, &[2, 2, 2]),
        "alltoallv: send has 5 elements, expected 6",
    );
    invalid(
        comm.alltoallv(&send, &[1, 2, 3], &mut recv[..4], &[2, 2, 2]),
        "alltoallv: recv has 4 elements, expected 6",
    );
    invalid(
        comm.alltoallv(&send, &[1, 2, 3], &mut recv, &[3, 1, 2]),
        "alltoallv: rank 1 sends itself 2 elements but expects 1",
    );
}

#[test]
fn uneven_transactions_are_rejected() {
    let mut comm = Silent { rank: 0, size: 2 };
    let send = [0f64; 5];
    let mut recv = [0f64; 2];
    let mut tx = Transaction::new();
    tx.reduce_scatter(&send, &mut recv, ReduceOp::Sum, Scale::NONE);
    invalid(
        comm.execute(tx),
        "2 blocks of 2 elements do not make the 5 elements given",
    );
}

/// One rank; sent messages wait in a queue until received. `native` counts
/// calls of its own allreduce, which overrides the default.
#[derive(Default)]
struct Loopback {
    queue: VecDeque<(u32, Vec<u8>)>,
    native: usize,
}

impl Topology for Loopback {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn local_rank(&self) -> usize {
        0
    }
    fn local_size(&self) -> usize {
        1
    }
}

impl Collectives for Loopback {
    fn send<T: Element>(&mut self, buf: &[T], _: usize, tag: u32) -> Result<()> {
        self.queue.push_back((tag, as_bytes(buf).to_vec()));
        Ok(())
    }
    fn recv<T: Element>(&mut self, buf: &mut [T], _: usize, tag: u32) -> Result<()> {
        let at = self.queue.iter().position(|(t, _)| *t == tag);
        match at.and_then(|at| self.queue.remove(at)) {
            Some((_, bytes)) => copy_from_bytes(buf, &bytes),
            None => Err(TransportError::Backend(format!(
                "no message with tag {tag}"
            ))),
        }
    }
    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()> {
        self.native += 1;
        kolo_transport::algorithms::ring_allreduce(self, buf, op, scale)
    }
}

#[test]
fn one_rank_applies_scales_and_copies() {
    let mut comm = Generic(Loopback::default());
    let mut ints = [7i32, -7, 3];
    let scale = Scale {
        prescale: 0.5,
        postscale: 2.0,
    };
    comm.allreduce(&mut ints, ReduceOp::Average, scale).unwrap();
    assert_eq!(
        ints,
        [6, -6, 2],
        "prescale rounds toward zero, then average and postscale"
    );

    let mut recv = [0.0f32; 3];
    comm.reduce_scatter(&[1.0, 2.0, 3.0], &mut recv, &[3], ReduceOp::Sum, scale)
        .unwrap();
    assert_eq!(recv, [1.0, 2.0, 3.0]);

    let mut gathered = [false; 2];
    comm.allgatherv(&[true, false], &mut gathered, &[2])
        .unwrap();
    assert_eq!(gathered, [true, false]);

    let mut all = [0u8; 2];
    comm.alltoallv(&[4, 5], &[2], &mut all, &[2]).unwrap();
    assert_eq!(all, [4, 5]);

    let mut buf = [9i64];
    comm.broadcast(&mut buf, 0).unwrap();
    comm.barrier().unwrap();
    assert_eq!(buf, [9]);

    let send = [1.5f64, 2.5];
    let (mut scattered, mut gathered) = ([0.0; 2], [0.0; 2]);
    let mut tx = Transaction::new();
    tx.reduce_scatter(&send, &mut scattered, ReduceOp::Max, Scale::NONE)
        .all_gather(&send, &mut gathered);
    comm.execute(tx).unwrap();
    assert_eq!((scattered, gathered), (send, send));
    assert!(comm.0.queue.is_empty(), "one rank sends no messages");
}

#[test]
fn empty_buffers_are_fine() {
    let mut comm = Generic(Loopback::default());
    comm.allreduce::<f32>(&mut [], ReduceOp::Product, Scale::NONE)
        .unwrap();
    comm.allgatherv::<u8>(&[], &mut [], &[0]).unwrap();
    comm.broadcast::<bool>(&mut [], 0).unwrap();
}

/// Generic over any backend, to be handed `&mut comm`.
fn allreduce_through<C: Collectives>(mut comm: C) -> Result<()> {
    comm.allreduce(&mut [1.0f32, 2.0], ReduceOp::Sum, Scale::NONE)
}

#[test]
fn a_mut_borrow_forwards_overridden_collectives() {
    let mut comm = Loopback::default();
    allreduce_through(&mut comm).unwrap();
    assert_eq!(comm.native, 1, "&mut C must call C's own allreduce");
    allreduce_through(&mut &mut comm).unwrap();
    assert_eq!(comm.native, 2);
    allreduce_through(Generic(&mut comm)).unwrap();
    assert_eq!(comm.native, 2, "Generic must bypass C's allreduce");
    let borrowed = &mut comm;
    assert_eq!(Topology::size(&borrowed), 1);
}

/// Counts the calls of its own segment allreduce, which claims to work in
/// place.
#[derive(Default)]
struct Segmented {
    inner: Loopback,
    native_segments: usize,
}

impl Topology for Segmented {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn local_rank(&self) -> usize {
        0
    }
    fn local_size(&self) -> usize {
        1
    }
}

impl Collectives for Segmented {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.inner.send(buf, peer, tag)
    }
    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.inner.recv(buf, peer, tag)
    }
    fn reduces_segments_in_place(&self) -> bool {
        true
    }
    fn allreduce_segments<T: Element>(
        &mut self,
        segments: &mut [&mut [T]],
        op: ReduceOp,
        scale: Scale,
    ) -> Result<()> {
        self.native_segments += 1;
        for segment in segments.iter_mut() {
            self.inner.allreduce(segment, op, scale)?;
        }
        Ok(())
    }
}

fn segments_through<C: Collectives>(mut comm: C) -> Result<bool> {
    let (mut a, mut b) = ([1i32, 2], [3i32]);
    let scale = Scale {
        prescale: 2.0,
        postscale: 1.0,
    };
    comm.allreduce_segments(&mut [&mut a[..], &mut [], &mut b[..]], ReduceOp::Sum, scale)?;
    assert_eq!((a, b), ([2, 4], [6]));
    Ok(comm.reduces_segments_in_place())
}

#[test]
fn the_default_segment_allreduce_runs_one_allreduce_per_segment() {
    let mut comm = Loopback::default();
    assert!(!segments_through(&mut comm).unwrap());
    assert_eq!(
        comm.native, 3,
        "one allreduce per segment, the empty one too"
    );
    comm.allreduce_segments::<f32>(&mut [], ReduceOp::Sum, Scale::NONE)
        .unwrap();
    assert_eq!(comm.native, 3, "no segments, no allreduce");
}

#[test]
fn a_mut_borrow_forwards_the_segment_allreduce_and_generic_does_not() {
    let mut comm = Segmented::default();
    assert!(segments_through(&mut comm).unwrap());
    assert!(segments_through(&mut &mut comm).unwrap());
    assert_eq!(comm.native_segments, 2, "&mut C must call C's own");
    assert!(!segments_through(Generic(&mut comm)).unwrap());
    assert_eq!(comm.native_segments, 2, "Generic must keep the default");
    assert_eq!(
        comm.inner.native, 6,
        "Generic's default runs the generic ring, not the inner allreduce"
    );
}
