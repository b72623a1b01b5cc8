//! Single-rank backends for the unit tests: a rank that talks to itself
//! through a queue (every collective from the trait's defaults), one that
//! claims to reduce segments in place, and one whose allocations come out
//! one element short.

use kolo_protocol::ReduceOp;
use kolo_transport::{Collectives, Element, Scale, Topology, TransportError};
use std::any::Any;
use std::collections::VecDeque;

/// Rank 0 of a communicator of one; messages to itself wait in a queue.
#[derive(Default)]
pub(crate) struct Loopback {
    queue: VecDeque<(u32, Box<dyn Any + Send>)>,
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

fn only_rank_zero(peer: usize) -> Result<(), TransportError> {
    if peer == 0 {
        Ok(())
    } else {
        Err(TransportError::InvalidArgument(format!(
            "peer {peer} out of range for size 1"
        )))
    }
}

impl Collectives for Loopback {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> kolo_transport::Result<()> {
        only_rank_zero(peer)?;
        self.queue.push_back((tag, Box::new(buf.to_vec())));
        Ok(())
    }

    fn recv<T: Element>(
        &mut self,
        buf: &mut [T],
        peer: usize,
        tag: u32,
    ) -> kolo_transport::Result<()> {
        only_rank_zero(peer)?;
        let position = self.queue.iter().position(|(t, _)| *t == tag);
        let Some((_, message)) = position.and_then(|p| self.queue.remove(p)) else {
            return Err(TransportError::InvalidArgument(format!(
                "no message with tag {tag} (it would hang)"
            )));
        };
        let Ok(message) = message.downcast::<Vec<T>>() else {
            return Err(TransportError::InvalidArgument(format!(
                "message with tag {tag} has another type"
            )));
        };
        if message.len() != buf.len() {
            return Err(TransportError::InvalidArgument(format!(
                "message of {} elements, receive buffer of {}",
                message.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(&message);
        Ok(())
    }
}

/// The loopback claiming to reduce segments in place: counts its
/// `allreduce_segments` calls and runs the trait's default (one allreduce
/// per segment).
#[derive(Default)]
pub(crate) struct InPlaceLoopback {
    inner: Loopback,
    pub(crate) segment_calls: usize,
}

impl Topology for InPlaceLoopback {
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

impl Collectives for InPlaceLoopback {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> kolo_transport::Result<()> {
        self.inner.send(buf, peer, tag)
    }

    fn recv<T: Element>(
        &mut self,
        buf: &mut [T],
        peer: usize,
        tag: u32,
    ) -> kolo_transport::Result<()> {
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
    ) -> kolo_transport::Result<()> {
        self.segment_calls += 1;
        for segment in segments.iter_mut() {
            self.inner.allreduce(segment, op, scale)?;
        }
        Ok(())
    }
}

/// The loopback, with allocations one element shorter than asked for: a
/// memory backend's bug that fusion must report, not index past.
pub(crate) struct ShortAllocator(pub(crate) Loopback);

impl Topology for ShortAllocator {
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

impl Collectives for ShortAllocator {
    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> kolo_transport::Result<()> {
        self.0.send(buf, peer, tag)
    }

    fn recv<T: Element>(
        &mut self,
        buf: &mut [T],
        peer: usize,
        tag: u32,
    ) -> kolo_transport::Result<()> {
        self.0.recv(buf, peer, tag)
    }

    fn new_buffer<T: Element>(&mut self, len: usize) -> kolo_transport::Result<Vec<T>> {
        Ok(vec![T::default(); len.saturating_sub(1)])
    }
}
