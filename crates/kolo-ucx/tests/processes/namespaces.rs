//! Ranks on two hosts: network namespaces this test makes itself (joined
//! by a veth pair, addresses 10.77.x.0/24 of their own), two ranks in
//! each, talking over UCX's TCP transport across the link; the rendezvous
//! store in the first. The namespaces are removed afterwards, also when
//! the job fails. Needs root and iproute2 (`scripts/install-deps.sh`);
//! `KOLO_NETNS_TESTS=0` leaves the job out, saying so.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The namespaces and their link, named after this process so that
/// concurrent runs do not collide; removed on drop.
struct Hosts {
    names: [String; 2],
    devices: [String; 2],
    addresses: [String; 2],
}

fn ip(args: &[&str]) -> Result<(), String> {
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
    fn make() -> Result<Hosts, String> {
        let id = std::process::id() % 100_000;
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
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", hosts.addresses[i]),
                "dev",
                dev,
            ])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
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

/// Four ranks of the conformance suite, two in each namespace.
pub fn job(exe: &std::path::Path) -> Result<(), String> {
    if std::env::var("KOLO_NETNS_TESTS").as_deref() == Ok("0") {
        println!("note: the two-namespace job left out (KOLO_NETNS_TESTS=0)");
        return Ok(());
    }
    let hosts = Hosts::make()?;
    let port = 29_000 + (std::process::id() % 1000) as u16;
    let (ranks, per_host) = (4usize, 2usize);
    let mut children = Vec::new();
    for rank in 0..ranks {
        let host = rank / per_host;
        let child = Command::new("ip")
            .args(["netns", "exec", &hosts.names[host]])
            .arg(exe)
            .env("MASTER_ADDR", &hosts.addresses[0])
            .env("MASTER_PORT", port.to_string())
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", ranks.to_string())
            .env("LOCAL_RANK", (rank % per_host).to_string())
            .env("LOCAL_WORLD_SIZE", per_host.to_string())
            .env("KOLO_RENDEZVOUS_TIMEOUT", "60")
            .env("UCX_TLS", "tcp,self")
            .env("UCX_NET_DEVICES", &hosts.devices[host])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting rank {rank}: {e}"))?;
        children.push(child);
    }
    let deadline = Instant::now() + super::JOB_BOUND;
    let mut report = String::new();
    for (rank, mut child) in children.into_iter().enumerate() {
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            report.push_str(&format!(
                "rank {rank} (namespace {}) ended with {}:\n{}{}\n",
                hosts.names[rank / per_host],
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    drop(hosts);
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}
