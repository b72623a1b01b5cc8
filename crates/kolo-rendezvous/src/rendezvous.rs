//! [`Rendezvous`]: a job's processes meeting at rank 0's store. Rank 0
//! serves the store on `MASTER_ADDR:MASTER_PORT`; every rank connects,
//! claims its rank (two processes claiming one are refused), checks that
//! all agree on the world size, and waits for the others. Afterwards the
//! ranks exchange what they need through the store (UCX worker
//! addresses, an NCCL unique id): [`Rendezvous::allgather`],
//! [`Rendezvous::broadcast`], [`Rendezvous::barrier`].

use crate::client::Client;
use crate::env::LaunchVars;
use crate::error::{RendezvousError, Result};
use crate::server::Server;
use std::time::Duration;

/// This process's place in a job, and its connection to the job's store.
#[derive(Debug)]
pub struct Rendezvous {
    vars: LaunchVars,
    client: Client,
    /// Rank 0's store, served while this lives.
    _server: Option<Server>,
    /// Exchanges made so far: each uses keys of its own.
    exchanges: u64,
}

impl Rendezvous {
    /// Joins the job the environment describes (see [`LaunchVars`]).
    pub fn from_env() -> Result<Rendezvous> {
        Rendezvous::join(LaunchVars::from_env()?)
    }

    /// Joins the job `vars` describes: rank 0 serves the store, every rank
    /// connects to it, claims its rank, checks the world size and waits
    /// for the others, all within `vars.timeout`.
    pub fn join(vars: LaunchVars) -> Result<Rendezvous> {
        let address = vars.store_address();
        let server = if vars.rank == 0 {
            Some(Server::bind(&address, vars.token.clone())?)
        } else {
            None
        };
        let reach = match &server {
            // Rank 0 reaches its own store where it listens (an address
            // of this host, or 0.0.0.0 meaning all of them).
            Some(server) => server.local_addr().to_string(),
            None => address.clone(),
        };
        let client = Client::connect(&reach, vars.token.as_deref(), vars.timeout)?;
        let mut rendezvous = Rendezvous {
            vars,
            client,
            _server: server,
            exchanges: 0,
        };
        rendezvous.claim()?;
        rendezvous.barrier("joined")?;
        Ok(rendezvous)
    }

    /// Claims this rank and checks the world size against the first
    /// rank's to claim.
    fn claim(&mut self) -> Result<()> {
        let (rank, world_size) = (self.vars.rank, self.vars.world_size);
        if self.client.add(&format!("kolo/rank/{rank}"), 1)? != 1 {
            return Err(RendezvousError::RankClaimedTwice {
                rank,
                address: self.client.address().to_owned(),
            });
        }
        let mine = format!("{world_size} {rank}");
        let held = self
            .client
            .compare_set("kolo/world_size", None, mine.as_bytes())?
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&held);
        let mut words = text.split(' ').map(str::parse::<usize>);
        match (words.next(), words.next()) {
            (Some(Ok(theirs)), Some(Ok(other_rank))) if theirs != world_size => {
                Err(RendezvousError::WorldSizeMismatch {
                    rank,
                    mine: world_size,
                    other_rank,
                    theirs,
                })
            }
            (Some(Ok(_)), Some(Ok(_))) => Ok(()),
            _ => Err(RendezvousError::Store {
                operation: "the world size check".into(),
                reason: format!("the store holds {text:?}"),
            }),
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.vars.rank
    }

    /// Processes in the job.
    pub fn world_size(&self) -> usize {
        self.vars.world_size
    }

    /// This process's rank on its host.
    pub fn local_rank(&self) -> usize {
        self.vars.local_rank
    }

    /// Processes on its host.
    pub fn local_world_size(&self) -> usize {
        self.vars.local_world_size
    }

    /// The variables it joined with.
    pub fn vars(&self) -> &LaunchVars {
        &self.vars
    }

    /// The connection to the store, for exchanges of a caller's own.
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// The timeout of every wait.
    fn timeout(&self) -> Duration {
        self.vars.timeout
    }

    /// The keys of exchange `name` (each call a new set of keys).
    fn next_prefix(&mut self, name: &str) -> String {
        self.exchanges += 1;
        format!("kolo/x/{}/{name}", self.exchanges)
    }

    /// Every rank's `mine`, in rank order (every rank calls it, in the
    /// same order as its other exchanges).
    pub fn allgather(&mut self, name: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let prefix = self.next_prefix(name);
        self.client
            .set(&format!("{prefix}/{}", self.vars.rank), mine)?;
        let keys: Vec<String> = (0..self.vars.world_size)
            .map(|r| format!("{prefix}/{r}"))
            .collect();
        let timeout = self.timeout();
        self.client.wait(&keys, timeout)?;
        keys.iter()
            .map(|key| self.client.get(key, timeout))
            .collect()
    }

    /// The root's `mine` on every rank (the other ranks' is ignored).
    pub fn broadcast(&mut self, name: &str, root: usize, mine: &[u8]) -> Result<Vec<u8>> {
        let key = self.next_prefix(name);
        if self.vars.rank == root {
            self.client.set(&key, mine)?;
            return Ok(mine.to_vec());
        }
        let timeout = self.timeout();
        self.client.get(&key, timeout)
    }

    /// Returns once every rank has called it.
    pub fn barrier(&mut self, name: &str) -> Result<()> {
        self.allgather(name, &[]).map(drop)
    }

    /// Leaves the job. Rank 0 serves the store until every other rank has
    /// left (its last call done, its connection closed) or the timeout has
    /// passed; the others say they leave and close their connection. Call
    /// it after a rank's last exchange; dropping rank 0's rendezvous
    /// without it stops the store at once.
    pub fn close(self) -> Result<()> {
        let (rank, world_size, timeout) = (self.vars.rank, self.vars.world_size, self.timeout());
        let Rendezvous {
            mut client,
            _server: server,
            ..
        } = self;
        if rank != 0 {
            return client.set(&format!("kolo/left/{rank}"), &[]);
        }
        let keys: Vec<String> = (1..world_size).map(|r| format!("kolo/left/{r}")).collect();
        client.wait(&keys, timeout)?;
        drop(client);
        if let Some(server) = server {
            let deadline = std::time::Instant::now() + timeout;
            while server.connections() > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Ok(())
    }
}
