//! What `kolo-run` starts: the variables of each local process, a pure
//! function of the command line (tested without starting anything).

/// The job as this host starts its part of it (the command line's
/// values, checked).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub nproc_per_node: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub token: String,
}

/// The most processes one host starts.
const MAX_LOCAL: usize = 4096;

impl Plan {
    /// Checks the command line's numbers; a port of 0 picks a free one
    /// (only for a job on one host, whose ranks all learn it from here);
    /// without a token a random one (likewise).
    pub fn new(
        nproc_per_node: usize,
        nnodes: usize,
        node_rank: usize,
        master_addr: &str,
        master_port: u16,
        token: Option<String>,
    ) -> Result<Plan, String> {
        if nproc_per_node == 0 || nproc_per_node > MAX_LOCAL {
            return Err(format!(
                "-n {nproc_per_node}: between 1 and {MAX_LOCAL} processes per host"
            ));
        }
        if nnodes == 0 || node_rank >= nnodes {
            return Err(format!(
                "--node-rank {node_rank} is not a host of --nnodes {nnodes}"
            ));
        }
        if nproc_per_node.checked_mul(nnodes).is_none() {
            return Err(format!(
                "{nnodes} hosts of {nproc_per_node} processes overflow"
            ));
        }
        let master_port =
            match (master_port, nnodes) {
                (0, 1) => free_port(master_addr)?,
                (0, _) => return Err(
                    "--master-port 0 picks a port on one host only: give every host the same port"
                        .into(),
                ),
                (port, _) => port,
            };
        let token = match (token, nnodes) {
            (Some(token), _) => token,
            (None, 1) => random_token()?,
            (None, _) => return Err(
                "a job on several hosts needs the same --token (or KOLO_RENDEZVOUS_TOKEN) on each"
                    .into(),
            ),
        };
        Ok(Plan {
            nproc_per_node,
            nnodes,
            node_rank,
            master_addr: master_addr.to_owned(),
            master_port,
            token,
        })
    }

    /// Processes in the job.
    pub fn world_size(&self) -> usize {
        self.nproc_per_node * self.nnodes
    }

    /// The global rank of local process `local`.
    pub fn rank(&self, local: usize) -> usize {
        self.node_rank * self.nproc_per_node + local
    }

    /// The variables of local process `local`: torchrun's, and the token.
    pub fn variables(&self, local: usize) -> Vec<(&'static str, String)> {
        let (world, rank) = (self.world_size(), self.rank(local));
        vec![
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("GROUP_WORLD_SIZE", self.nnodes.to_string()),
            ("ROLE_NAME", "default".into()),
            ("ROLE_RANK", rank.to_string()),
            ("ROLE_WORLD_SIZE", world.to_string()),
            ("TORCHELASTIC_RESTART_COUNT", "0".into()),
            ("TORCHELASTIC_MAX_RESTARTS", "0".into()),
            ("TORCHELASTIC_RUN_ID", "none".into()),
            ("TORCHELASTIC_USE_AGENT_STORE", "False".into()),
            ("KOLO_RENDEZVOUS_TOKEN", self.token.clone()),
        ]
    }
}

/// A free TCP port of `host`.
fn free_port(host: &str) -> Result<u16, String> {
    let listener = std::net::TcpListener::bind((host, 0))
        .map_err(|e| format!("finding a free port on {host}: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port on {host}: {e}"))
}

/// 128 random bits, in hex.
fn random_token() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("reading /dev/urandom for a token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_the_host_and_the_local_index() {
        let plan = Plan::new(4, 3, 2, "10.0.0.1", 29500, Some("t".into())).unwrap();
        assert_eq!(plan.world_size(), 12);
        let vars = plan.variables(1);
        let get = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(get("RANK"), "9");
        assert_eq!(get("WORLD_SIZE"), "12");
        assert_eq!(get("LOCAL_RANK"), "1");
        assert_eq!(get("LOCAL_WORLD_SIZE"), "4");
        assert_eq!(get("GROUP_RANK"), "2");
        assert_eq!(get("MASTER_PORT"), "29500");
        assert_eq!(get("KOLO_RENDEZVOUS_TOKEN"), "t");
    }

    #[test]
    fn one_host_gets_a_free_port_and_a_token() {
        let plan = Plan::new(2, 1, 0, "127.0.0.1", 0, None).unwrap();
        assert_ne!(plan.master_port, 0);
        assert_eq!(plan.token.len(), 32);
    }

    #[test]
    fn bad_numbers_are_refused_naming_them() {
        assert!(Plan::new(0, 1, 0, "h", 1, None)
            .unwrap_err()
            .contains("-n 0"));
        assert!(Plan::new(2, 2, 2, "h", 1, Some("t".into()))
            .unwrap_err()
            .contains("--node-rank 2"));
        assert!(Plan::new(2, 2, 0, "h", 0, Some("t".into()))
            .unwrap_err()
            .contains("--master-port 0"));
        assert!(Plan::new(2, 2, 0, "h", 1, None)
            .unwrap_err()
            .contains("--token"));
    }
}
