//! kolo-rendezvous: how the processes of a kolo job meet without MPI. Rank
//! 0 hosts a small key-value store over TCP at `MASTER_ADDR:MASTER_PORT`
//! ([`Server`]); every process connects ([`Client`]: set, get, wait for
//! keys, add, compare-and-set, delete, each with a timeout) and joins as
//! the launcher's variables say ([`Rendezvous::from_env`]: torchrun's
//! `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, each overridden
//! by its `KOLO_` twin). That is how ranks exchange UCX worker addresses
//! and the NCCL unique id under torchrun, Kubeflow, Ray or `kolo-run`.
//!
//! Pure Rust, no system library. The store listens only on the address it
//! is given, bounds every length and count it reads, refuses a client
//! that speaks another protocol or announces an oversized frame (and
//! serves the others on), and with `KOLO_RENDEZVOUS_TOKEN` set serves only
//! clients presenting the token, so a stray process on the network can
//! neither join a job nor read its keys.
//!
//! ```
//! use kolo_rendezvous::{LaunchVars, Rendezvous};
//! use std::time::Duration;
//!
//! // Two ranks of one job, as threads; a free port on loopback.
//! let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//! let vars = move |rank| LaunchVars {
//!     master_addr: "127.0.0.1".into(),
//!     master_port: port,
//!     rank,
//!     world_size: 2,
//!     local_rank: rank,
//!     local_world_size: 2,
//!     token: Some("secret".into()),
//!     timeout: Duration::from_secs(20),
//! };
//! let peer = std::thread::spawn(move || -> kolo_rendezvous::Result<Vec<Vec<u8>>> {
//!     let mut rendezvous = Rendezvous::join(vars(1))?;
//!     let all = rendezvous.allgather("address", b"rank one")?;
//!     rendezvous.close()?;
//!     Ok(all)
//! });
//! let mut rendezvous = Rendezvous::join(vars(0))?;
//! let all = rendezvous.allgather("address", b"rank zero")?;
//! rendezvous.close()?;
//! assert_eq!(all, [b"rank zero".to_vec(), b"rank one".to_vec()]);
//! assert_eq!(peer.join().unwrap()?, all);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod client;
mod controller;
mod env;
mod error;
mod rendezvous;
mod server;
pub mod store;
pub mod wire;

pub use client::Client;
pub use env::{LaunchVars, DEFAULT_PORT, DEFAULT_TIMEOUT};
pub use error::{RendezvousError, Result};
pub use rendezvous::Rendezvous;
pub use server::{Server, MAX_CONNECTIONS};
