//! One rank's buffers for one [`Spec`]: filled with the known inputs,
//! reset between iterations where the op works in place, run through a
//! backend's [`Collectives`], and checked against the reference.

use crate::buffer::{self, Pattern};
use crate::error::BenchError;
use crate::op::BenchOp;
use crate::reference::{count_wrong, Spec};
use kolo_transport::{Collectives, Element, Result, Scale};

/// The tag of the send/recv ring (any user tag works: one pair, one tag).
const SENDRECV_TAG: u32 = 7;

/// The buffers of one rank for one spec.
#[derive(Debug)]
pub struct Case<T> {
    spec: Spec,
    rank: usize,
    /// The input, from which the in-place ops (allreduce, broadcast)
    /// refill `recv`: no pristine copy of the whole input is kept.
    pattern: Pattern<T>,
    /// The send buffer (empty for the in-place ops).
    send: Vec<T>,
    /// The receive buffer; the in-place buffer for allreduce and broadcast.
    recv: Vec<T>,
    /// Per-rank block counts of the gathered ops.
    counts: Vec<usize>,
}

impl<T: Element> Case<T> {
    /// Allocates and fills rank `rank`'s buffers for `spec`; an error naming
    /// the buffer when the allocator refuses it.
    pub fn new(spec: Spec, rank: usize) -> Result<Case<T>, BenchError> {
        let layout = spec.layout;
        let pattern = Pattern::new(&spec, rank);
        let (send, recv) = if in_place(spec.op) {
            (Vec::new(), buffer::input(&spec, &pattern, 0, layout.recv)?)
        } else {
            (
                buffer::input(&spec, &pattern, 0, layout.send)?,
                buffer::zeroed(&spec, layout.recv)?,
            )
        };
        Ok(Case {
            spec,
            rank,
            pattern,
            send,
            recv,
            counts: vec![layout.block; spec.ranks],
        })
    }

    /// Prepares the next iteration (untimed). An in-place allreduce needs its
    /// input back every time; before the `last` (checked) iteration every
    /// output buffer is restored or cleared, so that a result left over from
    /// an earlier iteration cannot pass the check.
    pub fn prepare(&mut self, last: bool) {
        match self.spec.op {
            BenchOp::Allreduce => self.pattern.fill(&mut self.recv, 0),
            BenchOp::Broadcast if last => self.pattern.fill(&mut self.recv, 0),
            _ if last => self.recv.fill(T::default()),
            _ => {}
        }
    }

    /// Runs the collective once.
    pub fn execute<C: Collectives>(&mut self, comm: &mut C) -> Result<()> {
        let n = self.spec.ranks;
        match self.spec.op {
            BenchOp::Allreduce => comm.allreduce(&mut self.recv, self.spec.redop, Scale::NONE),
            BenchOp::Allgather => comm.allgatherv(&self.send, &mut self.recv, &self.counts),
            BenchOp::Broadcast => comm.broadcast(&mut self.recv, 0),
            BenchOp::Reducescatter => comm.reduce_scatter(
                &self.send,
                &mut self.recv,
                &self.counts,
                self.spec.redop,
                Scale::NONE,
            ),
            BenchOp::Alltoall => {
                comm.alltoallv(&self.send, &self.counts, &mut self.recv, &self.counts)
            }
            BenchOp::Sendrecv => comm.sendrecv(
                &self.send,
                (self.rank + 1) % n,
                &mut self.recv,
                (self.rank + n - 1) % n,
                SENDRECV_TAG,
            ),
        }
    }

    /// The receive buffer (the in-place buffer of allreduce and
    /// broadcast), for running the same iteration through another library
    /// (the `--baseline`).
    pub fn recv_mut(&mut self) -> &mut [T] {
        &mut self.recv
    }

    /// How many elements of the result differ from the reference.
    pub fn wrong(&self) -> u64 {
        wrong_elements(&self.spec, self.rank, &self.recv)
    }
}

/// How many elements of rank `rank`'s result `recv` (its receive buffer,
/// the in-place buffer for allreduce and broadcast) differ from the
/// reference of `spec`.
pub fn wrong_elements<T: Element>(spec: &Spec, rank: usize, recv: &[T]) -> u64 {
    let round = |v: f64| T::from_f64(v).to_f64();
    count_wrong(spec.dtype, recv.iter().map(|v| v.to_f64()), |i| {
        spec.expected(rank, i, &round)
    })
}

fn in_place(op: BenchOp) -> bool {
    matches!(op, BenchOp::Allreduce | BenchOp::Broadcast)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_protocol::{DataType, ReduceOp};
    use kolo_transport::{Topology, TransportError};

    /// Rank 1 of 2 ranks whose collectives return at once without moving
    /// any data: every result must then fail the check.
    struct Idle;

    impl Topology for Idle {
        fn rank(&self) -> usize {
            1
        }
        fn size(&self) -> usize {
            2
        }
        fn local_rank(&self) -> usize {
            1
        }
        fn local_size(&self) -> usize {
            2
        }
    }

    impl Collectives for Idle {
        fn send<T: Element>(&mut self, _: &[T], _: usize, _: u32) -> Result<()> {
            Ok(())
        }
        fn recv<T: Element>(&mut self, _: &mut [T], _: usize, _: u32) -> Result<()> {
            Err(TransportError::Backend("idle".into()))
        }
        fn sendrecv<T: Element>(
            &mut self,
            _: &[T],
            _: usize,
            _: &mut [T],
            _: usize,
            _: u32,
        ) -> Result<()> {
            Ok(())
        }
        fn allreduce<T: Element>(&mut self, _: &mut [T], _: ReduceOp, _: Scale) -> Result<()> {
            Ok(())
        }
        fn allgatherv<T: Element>(&mut self, _: &[T], _: &mut [T], _: &[usize]) -> Result<()> {
            Ok(())
        }
        fn broadcast<T: Element>(&mut self, _: &mut [T], _: usize) -> Result<()> {
            Ok(())
        }
        fn reduce_scatter<T: Element>(
            &mut self,
            _: &[T],
            _: &mut [T],
            _: &[usize],
            _: ReduceOp,
            _: Scale,
        ) -> Result<()> {
            Ok(())
        }
        fn alltoallv<T: Element>(
            &mut self,
            _: &[T],
            _: &[usize],
            _: &mut [T],
            _: &[usize],
        ) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_backend_that_moves_nothing_fails_the_check() {
        for op in BenchOp::ALL {
            let spec = Spec {
                op,
                dtype: DataType::I32,
                redop: ReduceOp::Sum,
                layout: op.layout(1024, 4, 2),
                ranks: 2,
            };
            let mut case = Case::<i32>::new(spec, 1).unwrap();
            // Warm-up, then the checked iteration.
            for last in [false, true] {
                case.prepare(last);
                case.execute(&mut Idle).unwrap();
            }
            let wrong = case.wrong();
            assert!(wrong > 0, "{op}: no wrong element found");
            assert!(wrong <= spec.layout.recv as u64, "{op}: {wrong}");
        }
    }
}
