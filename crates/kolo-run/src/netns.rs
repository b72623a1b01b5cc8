//! Two hosts on one machine, for tests of jobs that span hosts: network
//! namespaces joined by a veth pair, each with an address of its own
//! (10.77.x.1 and 10.77.x.2), made by [`Hosts::make`] and removed on drop,
//! also when the job fails. [`run_on_hosts`] starts a job's ranks in them
//! (`ip netns exec`), as `kolo-run --nnodes 2` would on two machines, with
//! every rank's output kept. Needs root and iproute2
//! (`scripts/install-deps.sh`); `KOLO_NETNS_TESTS=0` turns such tests off
//! ([`Hosts::enabled`]).

use crate::plan::Plan;
use crate::{collect, drain, RankOutput};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The two namespaces and their link, named after this process so that
/// concurrent runs do not collide; removed on drop.
pub struct Hosts {
    /// The namespaces.
    pub names: [String; 2],
    /// Each one's end of the veth pair.
    pub devices: [String; 2],
    /// Each one's address on the link.
    pub addresses: [String; 2],
}

/// Runs `ip args`, naming the command and what it said on failure.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e} (iproute2 is needed)", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {} (root and iproute2 are needed)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    /// False when `KOLO_NETNS_TESTS=0` leaves namespace tests out.
    pub fn enabled() -> bool {
        std::env::var("KOLO_NETNS_TESTS").as_deref() != Ok("0")
    }

    /// Makes the namespaces, the link and the addresses. `salt` tells
    /// apart two sets made by one process.
    pub fn make(salt: u32) -> Result<Hosts, String> {
        let id = (std::process::id() % 50_000) * 2 + salt % 2;
        let subnet = 1 + id % 250;
        let hosts = Hosts {
            names: [format!("kolo{id}a"), format!("kolo{id}b")],
            devices: [format!("kv{id}a"), format!("kv{id}b")],
            addresses: [format!("10.77.{subnet}.1"), format!("10.77.{subnet}.2")],
        };
        for ns in &hosts.names {
            ip(&["netns", "add", ns])?;
        }
        let [da, db] = &hosts.devices;
        ip(&["link", "add", da, "type", "veth", "peer", "name", db])?;
        for i in 0..2 {
            let (ns, dev) = (&hosts.names[i], &hosts.devices[i]);
            ip(&["link", "set", dev, "netns", ns])?;
            let address = format!("{}/24", hosts.addresses[i]);
            ip(&["-n", ns, "addr", "add", &address, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// Sets host `host`'s end of the link up or down.
    pub fn set_link(&self, host: usize, up: bool) -> Result<(), String> {
        let state = if up { "up" } else { "down" };
        ip(&[
            "-n",
            &self.names[host],
            "link",
            "set",
            &self.devices[host],
            state,
        ])
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Removing a namespace removes its end of the veth pair, and with
        // it the other.
        for ns in &self.names {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Runs `per_host` ranks of `program args` in each of `hosts` (ranks
/// `0..per_host` in the first, which serves the rendezvous store), with
/// torchrun's variables, UCX's TCP transport on the host's end of the
/// link, and `env`; every rank ends within `bound` (killed at it). A port
/// of the store derived from this process's id.
pub fn run_on_hosts(
    hosts: &Hosts,
    per_host: usize,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    bound: Duration,
) -> Result<Vec<RankOutput>, String> {
    use std::os::unix::process::CommandExt;
    let port = 29_000 + (std::process::id() % 1000) as u16;
    let token = format!("netns-{}", std::process::id());
    let mut running = Vec::with_capacity(2 * per_host);
    for (node, (name, device)) in hosts.names.iter().zip(&hosts.devices).enumerate() {
        let plan = Plan::new(
            per_host,
            2,
            node,
            &hosts.addresses[0],
            port,
            Some(token.clone()),
        )?;
        for local in 0..per_host {
            let mut child = Command::new("ip")
                .args(["netns", "exec", name])
                .arg(program)
                .args(args)
                .envs(plan.variables(local))
                .env("UCX_TLS", "tcp,self")
                .env("UCX_NET_DEVICES", device)
                .env("KOLO_NETNS_DEVICE", device)
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .spawn()
                .map_err(|e| format!("starting a rank in {name}: {e}"))?;
            let out = child.stdout.take().map(drain);
            let err = child.stderr.take().map(drain);
            running.push((child, out, err));
        }
    }
    Ok(collect(running, bound))
}
