//! Ranks on two hosts: network namespaces this test makes itself (joined
//! by a veth pair, addresses 10.77.x.0/24 of their own, see
//! `kolo_run::netns`), two ranks in each, talking over UCX's TCP transport
//! across the link; the rendezvous store in the first. The namespaces are
//! removed afterwards, also when the job fails. Needs root and iproute2
//! (`scripts/install-deps.sh`); `KOLO_NETNS_TESTS=0` leaves the job out,
//! saying so.

use kolo_run::netns::{run_on_hosts, Hosts};

/// Four ranks of the conformance suite, two in each namespace.
pub fn job(exe: &std::path::Path) -> Result<(), String> {
    if !Hosts::enabled() {
        println!("note: the two-namespace job left out (KOLO_NETNS_TESTS=0)");
        return Ok(());
    }
    let hosts = Hosts::make(0)?;
    let env = [("KOLO_RENDEZVOUS_TIMEOUT", "60")];
    let ranks = run_on_hosts(&hosts, 2, exe, &[], &env, super::JOB_BOUND)?;
    let report: String = ranks
        .iter()
        .filter(|r| !r.succeeded())
        .map(|r| {
            format!(
                "rank {} (namespace {}) ended with {:?}:\n{}{}\n",
                r.rank,
                hosts.names[r.rank / 2],
                r.status,
                r.stdout,
                r.stderr
            )
        })
        .collect();
    drop(hosts);
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}
