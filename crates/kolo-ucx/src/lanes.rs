//! [`UcxComm`]'s several exchanges at once
//! ([`kolo_transport::Collectives::sendrecv_lanes`]): every receive posted,
//! then every send, then one wait for them all, so that the messages of
//! the hierarchical allreduce's rings travel side by side (one over the
//! link between hosts, others inside the host) instead of in turn.

use crate::comm::{check_length, UcxComm};
use crate::safe::wait::{wait_all, InFlight};
use crate::tags::{self, Plane};
use kolo_transport::byte_view::{as_bytes, as_bytes_mut};
use kolo_transport::{Collectives, Element, Lane, Result};
use std::time::Instant;

impl UcxComm {
    pub(crate) fn exchange_lanes<T: Element>(&mut self, lanes: &mut [Lane<'_, T>]) -> Result<()> {
        for lane in lanes.iter() {
            self.check_peer(lane.dst)?;
            self.check_peer(lane.src)?;
        }
        let Some(first) = lanes.first_mut() else {
            return Ok(());
        };
        if as_bytes_mut(&mut *first.recv).is_none() {
            // bools: each receive is checked through a staging buffer.
            for lane in lanes.iter_mut() {
                self.sendrecv(lane.send, lane.dst, &mut *lane.recv, lane.src, lane.tag)?;
            }
            return Ok(());
        }
        let mut requests: Vec<InFlight> = Vec::with_capacity(2 * lanes.len());
        let mut wants = Vec::with_capacity(lanes.len());
        let mut started = Ok(());
        for lane in lanes.iter_mut() {
            let tag = tags::tag(lane.src, lane.tag, Plane::Data);
            let Some(bytes) = as_bytes_mut(&mut *lane.recv) else {
                continue;
            };
            wants.push(bytes.len());
            match self.start_recv(bytes, tag) {
                Ok(request) => requests.push(request),
                Err(e) => {
                    started = Err(e);
                    break;
                }
            }
        }
        if started.is_ok() {
            for lane in lanes.iter() {
                let tag = tags::tag(self.rank, lane.tag, Plane::Data);
                match self.start_send(as_bytes(lane.send), lane.dst, tag) {
                    Ok(request) => requests.push(request),
                    Err(e) => {
                        started = Err(e);
                        break;
                    }
                }
            }
        }
        if let Err(e) = started {
            // Ends (cancels) what was started, so that UCX lets go of the
            // buffers before they are returned to the caller.
            let now = Some(Instant::now());
            let _ = wait_all(&mut self.worker, &mut requests, &[], now, None, 0);
            return Err(e);
        }
        let src = lanes[0].src;
        self.wait(&mut requests, src, "an exchange")?;
        for ((request, want), lane) in requests.iter().zip(wants).zip(lanes.iter()) {
            check_length(request.received, want, lane.src, "an exchange")?;
        }
        Ok(())
    }
}
