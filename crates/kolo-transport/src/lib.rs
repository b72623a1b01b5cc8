//! kolo-transport: the traits every kolo backend implements.
//!
//! (Crate docs with a runnable example: owned by the transport work.)

pub mod algorithms;
pub mod element;
pub mod error;
pub mod traits;
pub mod transaction;

pub use element::Element;
pub use error::{Result, TransportError};
pub use algorithms::Generic;
pub use traits::{Backend, BitOp, Collectives, Controller, MemoryKind, Scale, Topology};
pub use transaction::{Transaction, TxOp};
