//! The UCX settings kolo changes from UCX's defaults for its own context,
//! each only where the environment leaves it to UCX.
//!
//! UCX's TCP transport sends a message of up to `UCX_TCP_TX_SEG_SIZE`
//! (8 KiB) eagerly in one piece and anything larger through its
//! rendezvous, which over TCP is a request, a reply and then the data in
//! receive segments of `UCX_TCP_RX_SEG_SIZE` (64 KiB), each its own system
//! calls and handler. kolo's ring steps exchange 256 KiB segments and
//! halves of a buffer, so every step paid the handshake and hundreds of
//! small reads: about half of OpenMPI's bandwidth over the same loopback.
//! With 1 MiB segments a step's message goes eagerly in one piece and a
//! larger one moves in 1 MiB pieces. The transport allocates its segments
//! as messages need them, so the larger size costs memory only where
//! messages are that large.
//!
//! That is right where TCP only loops back inside one host, whose link is
//! a copy as fast as the receiver's. Between hosts the link is the slower
//! part, and a message in one piece is first sent whole, then copied out
//! whole, each side idle while the other works; 256 KiB pieces let the
//! receiver copy one while the next is on the wire. Across two network
//! namespaces of a 2-core machine (veth, one rank each), that moved 1 MiB
//! allreduces in 0.59-0.87x the time of 1 MiB segments over four runs
//! of 10-24 rounds, 64 MiB in 0.90x, and 16 MiB within the noise
//! (0.91-1.08x). So a job whose ranks span hosts gets 256 KiB.

use std::ffi::CStr;

/// One setting kolo applies: the name `ucp_config_modify` takes (without
/// `UCX_` and the transport's prefix) and its value.
pub(crate) type Setting = (&'static CStr, &'static CStr);

/// The size of UCX's TCP send and receive segments in kolo's context, for
/// a job on one host.
const TCP_SEGMENT: &CStr = c"1M";
/// The same for a job whose ranks span hosts.
const TCP_SEGMENT_ACROSS_HOSTS: &CStr = c"256K";

/// What kolo sets on top of the configuration UCX read, given the
/// environment (`var` looks a variable up) and whether the job's ranks
/// span hosts (`across_hosts`: fewer ranks on this host than in the job,
/// as the launcher counts them). The two segment sizes go
/// together (UCX needs the receive segment at least as large as the send
/// segment), so a user who sets either keeps UCX's default for the other;
/// and neither is set where `UCX_TLS` rules TCP out, where UCX would warn
/// of a setting no transport took.
pub(crate) fn settings(var: impl Fn(&str) -> Option<String>, across_hosts: bool) -> Vec<Setting> {
    let user_set = |name: &str| var(name).is_some();
    if user_set("UCX_TCP_TX_SEG_SIZE") || user_set("UCX_TCP_RX_SEG_SIZE") {
        return Vec::new();
    }
    if !tcp_allowed(var("UCX_TLS").as_deref()) {
        return Vec::new();
    }
    let segment = if across_hosts {
        TCP_SEGMENT_ACROSS_HOSTS
    } else {
        TCP_SEGMENT
    };
    vec![(c"TX_SEG_SIZE", segment), (c"RX_SEG_SIZE", segment)]
}

/// Whether `UCX_TLS` (unset: every transport) lets UCX use TCP: a list
/// naming `tcp` or `all`, or an exclusion list (`^...`) that does not name
/// `tcp`. Entries may carry a `:aux` suffix.
fn tcp_allowed(tls: Option<&str>) -> bool {
    let Some(tls) = tls.map(str::trim).filter(|t| !t.is_empty()) else {
        return true;
    };
    let (excluded, list) = match tls.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, tls),
    };
    let names_tcp = list
        .split(',')
        .map(|entry| entry.split(':').next().unwrap_or("").trim())
        .any(|name| {
            name.eq_ignore_ascii_case("tcp") || (!excluded && name.eq_ignore_ascii_case("all"))
        });
    names_tcp != excluded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Vec<Setting> {
        across(vars, false)
    }

    fn across(vars: &[(&str, &str)], across_hosts: bool) -> Vec<Setting> {
        settings(
            |name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            },
            across_hosts,
        )
    }

    const SEGMENTS: [Setting; 2] = [(c"TX_SEG_SIZE", c"1M"), (c"RX_SEG_SIZE", c"1M")];

    #[test]
    fn segments_are_set_where_tcp_may_be_used() {
        assert_eq!(with(&[]), SEGMENTS);
        assert_eq!(with(&[("UCX_TLS", "tcp,self")]), SEGMENTS);
        assert_eq!(with(&[("UCX_TLS", "sm,tcp:aux")]), SEGMENTS);
        assert_eq!(with(&[("UCX_TLS", "all")]), SEGMENTS);
        assert_eq!(with(&[("UCX_TLS", "^ib")]), SEGMENTS);
        assert_eq!(with(&[("UCX_TLS", "")]), SEGMENTS);
    }

    #[test]
    fn a_job_across_hosts_gets_smaller_segments() {
        assert_eq!(
            across(&[("UCX_TLS", "tcp,self")], true),
            [(c"TX_SEG_SIZE", c"256K"), (c"RX_SEG_SIZE", c"256K")]
        );
        assert!(across(&[("UCX_TLS", "sm,self")], true).is_empty());
        assert!(across(&[("UCX_TCP_TX_SEG_SIZE", "64K")], true).is_empty());
    }

    #[test]
    fn nothing_is_set_where_tcp_is_ruled_out() {
        assert!(with(&[("UCX_TLS", "sm,self")]).is_empty());
        assert!(with(&[("UCX_TLS", "^tcp")]).is_empty());
        assert!(with(&[("UCX_TLS", "^ib,tcp")]).is_empty());
    }

    #[test]
    fn a_user_setting_of_either_segment_keeps_both_to_ucx() {
        assert!(with(&[("UCX_TCP_TX_SEG_SIZE", "64K")]).is_empty());
        assert!(with(&[("UCX_TCP_RX_SEG_SIZE", "256K"), ("UCX_TLS", "tcp")]).is_empty());
    }
}
