//! The engine layer: what runs below the API, and never reaches up to it.
//!
//! A caller's [`submission::Submission`] (one tensor, a list, or a
//! [`crate::TensorGroup`]'s tensors) enters the tensor [`table`], which
//! gives each name an id and queues the submission for the background
//! thread ([`launch`] starts it, [`background`] is its loop). Each
//! [`cycle`] takes the queue, negotiates with the other ranks through the
//! coordinator, and hands what they agreed to the [`perform`]er, which holds
//! the taken submissions ([`batches`]) until their tensors are done, fuses
//! and runs the collectives on the backend (host memory) or the device
//! plane ([`placement`]), and leaves the results in each submission's
//! [`completion`]. A caller waiting on one may run the cycles itself
//! ([`progress`]). Scopes lend the caller's memory under a [`lease`].
//! A [`watchdog`] bounds each operation's time and spreads a fault to
//! every rank it can reach, with each rank's [`desync`] standing.
//! With [`autotune`] on, the cycle also tunes the fusion threshold and
//! cycle time during the first steps.

pub(crate) mod autotune;
pub(crate) mod background;
pub(crate) mod batches;
pub(crate) mod completion;
pub(crate) mod cycle;
pub(crate) mod desync;
pub(crate) mod launch;
pub(crate) mod lease;
pub(crate) mod names;
pub(crate) mod perform;
pub(crate) mod placement;
pub(crate) mod progress;
pub(crate) mod shared;
pub(crate) mod submission;
pub(crate) mod table;
pub(crate) mod watchdog;
