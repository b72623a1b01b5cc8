//! kolo-transport: the traits every kolo backend implements, the element
//! kernels, and collective algorithms written once over point-to-point.
//!
//! A backend implements [`Topology`] (who am I), [`Controller`] (the control
//! plane: small byte messages for negotiation) and [`Collectives`] (the data
//! plane: allreduce, also over scattered segments, allgatherv, broadcast,
//! reduce-scatter, alltoallv, send/recv, barrier, transactions). Only `send` and `recv` are required of
//! the data plane: every collective defaults to a generic algorithm of
//! [`algorithms`] (ring allreduce, ring allgatherv, binomial-tree broadcast,
//! ...), which backends with native collectives override. [`Element`] is
//! what a tensor may hold (u8 … f64, f16, bf16, bool) and carries the
//! vectorized reduction kernels every backend shares; [`with_element_type!`]
//! turns a runtime [`kolo_protocol::DataType`] into a static type.
//!
//! # Example: a backend from `send` and `recv` alone
//!
//! A single rank that talks to itself through a queue gets allreduce,
//! broadcast and the rest from the defaults:
//!
//! ```
//! use std::collections::VecDeque;
//! use kolo_protocol::ReduceOp;
//! use kolo_transport::{byte_view, Collectives, Element, Result, Scale, Topology, TransportError};
//!
//! /// One rank; sent messages wait in a queue until received.
//! #[derive(Default)]
//! struct Loopback {
//!     queue: VecDeque<(u32, Vec<u8>)>,
//! }
//!
//! impl Topology for Loopback {
//!     fn rank(&self) -> usize { 0 }
//!     fn size(&self) -> usize { 1 }
//!     fn local_rank(&self) -> usize { 0 }
//!     fn local_size(&self) -> usize { 1 }
//! }
//!
//! impl Collectives for Loopback {
//!     fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
//!         if peer != 0 {
//!             return Err(TransportError::InvalidArgument(format!("peer {peer} of 1 rank")));
//!         }
//!         self.queue.push_back((tag, byte_view::as_bytes(buf).to_vec()));
//!         Ok(())
//!     }
//!
//!     fn recv<T: Element>(&mut self, buf: &mut [T], _peer: usize, tag: u32) -> Result<()> {
//!         let at = self.queue.iter().position(|(t, _)| *t == tag);
//!         match at.and_then(|at| self.queue.remove(at)) {
//!             Some((_, bytes)) => byte_view::copy_from_bytes(buf, &bytes),
//!             None => Err(TransportError::Backend(format!("no message with tag {tag}"))),
//!         }
//!     }
//! }
//!
//! # fn main() -> Result<()> {
//! let mut comm = Loopback::default();
//!
//! // Collectives come from the generic algorithms.
//! let mut grads = [1.0f32, 2.0, 3.0];
//! comm.allreduce(&mut grads, ReduceOp::Average, Scale { prescale: 1.0, postscale: 2.0 })?;
//! assert_eq!(grads, [2.0, 4.0, 6.0]);
//!
//! let mut gathered = [0i64; 2];
//! comm.allgatherv(&[7, 8], &mut gathered, &[2])?;
//! assert_eq!(gathered, [7, 8]);
//!
//! // Point-to-point as implemented above; a wrong length is an error.
//! comm.send(&[5u16, 6], 0, 3)?;
//! let mut short = [0u16; 1];
//! assert!(comm.recv(&mut short, 0, 3).is_err());
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod algorithms;
pub mod byte_view;
pub mod copies;
mod dispatch;
pub mod element;
pub mod error;
mod forward;
pub mod memory;
pub mod traits;
pub mod transaction;

pub use algorithms::{Generic, BACKEND_TAG_BASE, RESERVED_TAG_BASE};
pub use element::Element;
pub use error::{Result, TransportError};
pub use memory::{Host, Memory};
pub use traits::{Backend, BitOp, Collectives, Controller, Lane, MemoryKind, Scale, Topology};
pub use transaction::{Transaction, TxOp};

/// Paths used by [`with_element_type!`]; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use half::{bf16, f16};
    pub use kolo_protocol::DataType;
}
