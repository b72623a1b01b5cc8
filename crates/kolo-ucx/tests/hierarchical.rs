//! The hierarchical allreduce (`KOLO_HIERARCHICAL_ALLREDUCE=1`) over UCX's
//! TCP transport, as a cluster runs it: 2 hosts of 2 ranks made of network
//! namespaces (`kolo_run::netns`; needs root and iproute2,
//! `KOLO_NETNS_TESTS=0` leaves the job out, saying so), and the same
//! layout, then an uneven one (3 + 1, which stays flat), on loopback
//! where the hosts are only what each rank's local rank says. `cargo test`
//! runs this binary directly; it then starts itself once per rank with
//! torchrun's variables, and each rank checks allreduces of f32 and i64,
//! sum and average, at lengths from 0 (below the number of ranks, odd,
//! across the flat path's threshold, several ring segments) against the
//! sums it computes itself, through the communicator's allreduce and
//! through `hierarchical_allreduce` directly.

use kolo_protocol::ReduceOp;
use kolo_rendezvous::{LaunchVars, Rendezvous};
use kolo_run::netns::{run_on_hosts, Hosts};
use kolo_run::RankOutput;
use kolo_transport::algorithms::{hierarchical_allreduce, HostLayout};
use kolo_transport::{Collectives, Controller, Element, Scale, Topology};
use kolo_ucx::UcxComm;
use std::process::ExitCode;
use std::time::Duration;

/// A job of this test: `Err` says what its ranks printed.
type Job = fn(&std::path::Path) -> Result<(), String>;

/// How long one job may take.
const JOB_BOUND: Duration = Duration::from_secs(300);

/// The sizes of the loopback jobs' made-up hosts (consecutive ranks), for
/// the ranks to take their local rank from; and whether the allreduce
/// must come out hierarchical.
const HOSTS_VAR: &str = "KOLO_TEST_HOST_SIZES";
const EXPECT_VAR: &str = "KOLO_TEST_EXPECT_HIERARCHICAL";

/// Lengths in elements: empty, shorter than the 4 ranks, odd, around the
/// flat path's 32 KiB (8192 f32), longer than a 256 KiB ring segment.
const LENGTHS: [usize; 12] = [0, 1, 2, 3, 5, 7, 1001, 8191, 8192, 8193, 100_003, 1 << 20];

fn main() -> ExitCode {
    if std::env::var_os("RANK").is_some() {
        return match rank_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(why) => {
                eprintln!("FAILED: {why}");
                ExitCode::FAILURE
            }
        };
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let jobs: [(&str, Job); 3] = [
        ("hierarchical_two_namespaces_tcp_2x2", namespaces_job),
        ("hierarchical_loopback_tcp_2x2", |exe| {
            loopback_job(exe, "2,2", true)
        }),
        ("hierarchical_loopback_tcp_uneven_3_1", |exe| {
            loopback_job(exe, "3,1", false)
        }),
    ];
    let mut failed = Vec::new();
    for (name, job) in jobs {
        match job(&exe) {
            Ok(()) => println!("test {name} ... ok"),
            Err(why) => {
                println!("test {name} ... FAILED\n{why}");
                failed.push(name);
            }
        }
    }
    if failed.is_empty() {
        println!("test result: ok. {} passed; 0 failed", jobs.len());
        ExitCode::SUCCESS
    } else {
        println!("test result: FAILED. failed: {failed:?}");
        ExitCode::FAILURE
    }
}

/// Two ranks in each of two namespaces, over the veth link between them.
/// The namespaces are removed afterwards, also when the job fails.
fn namespaces_job(exe: &std::path::Path) -> Result<(), String> {
    if !Hosts::enabled() {
        println!("note: the two-namespace job left out (KOLO_NETNS_TESTS=0)");
        return Ok(());
    }
    let hosts = Hosts::make(0)?;
    let env = [
        ("KOLO_RENDEZVOUS_TIMEOUT", "60"),
        ("KOLO_HIERARCHICAL_ALLREDUCE", "1"),
        (EXPECT_VAR, "1"),
    ];
    let ranks = run_on_hosts(&hosts, 2, exe, &[], &env, JOB_BOUND);
    let names = hosts.names.clone();
    drop(hosts);
    report(&ranks?, |rank| format!(" (namespace {})", names[rank / 2]))
}

/// Four ranks on this host, in made-up hosts of `sizes` ranks.
fn loopback_job(exe: &std::path::Path, sizes: &str, hierarchical: bool) -> Result<(), String> {
    let expect = if hierarchical { "1" } else { "0" };
    let env = [
        ("UCX_TLS", "tcp,self"),
        ("KOLO_RENDEZVOUS_TIMEOUT", "60"),
        ("KOLO_HIERARCHICAL_ALLREDUCE", "1"),
        (HOSTS_VAR, sizes),
        (EXPECT_VAR, expect),
    ];
    let ranks = kolo_run::run_captured(4, exe, &[], &env, JOB_BOUND)?;
    report(&ranks, |_| String::new())
}

/// `Ok` when every rank succeeded, else what the others printed.
fn report(ranks: &[RankOutput], place: impl Fn(usize) -> String) -> Result<(), String> {
    let failures: String = ranks
        .iter()
        .filter(|r| !r.succeeded())
        .map(|r| {
            format!(
                "rank {}{} ended with {:?}:\n{}{}\n",
                r.rank,
                place(r.rank),
                r.status,
                r.stdout,
                r.stderr
            )
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}

/// The launch variables, with the local rank and size of the made-up
/// hosts where [`HOSTS_VAR`] gives them.
fn launch_vars() -> Result<LaunchVars, String> {
    let mut vars = LaunchVars::from_env().map_err(|e| e.to_string())?;
    let Ok(sizes) = std::env::var(HOSTS_VAR) else {
        return Ok(vars);
    };
    let mut start = 0;
    for size in sizes.split(',') {
        let size: usize = size.parse().map_err(|e| format!("{HOSTS_VAR}: {e}"))?;
        if vars.rank < start + size {
            vars.local_rank = vars.rank - start;
            vars.local_world_size = size;
            return Ok(vars);
        }
        start += size;
    }
    Err(format!(
        "{HOSTS_VAR}={sizes} has no host for rank {}",
        vars.rank
    ))
}

fn rank_main() -> Result<(), String> {
    let mut rendezvous = Rendezvous::join(launch_vars()?).map_err(|e| e.to_string())?;
    let mut comm = UcxComm::connect(&mut rendezvous).map_err(|e| format!("joining: {e}"))?;
    rendezvous.close().map_err(|e| e.to_string())?;
    let rank = comm.rank();
    let expect = std::env::var(EXPECT_VAR).as_deref() == Ok("1");
    if comm.hierarchy().is_some() != expect {
        return Err(format!(
            "rank {rank}: hierarchical allreduce {:?}, expected {expect}",
            comm.hierarchy()
        ));
    }
    // Every rank's host, as the first rank of it, to call the algorithm
    // directly also below the communicator's threshold.
    let host = (rank - comm.local_rank()) as u64;
    let hosts: Vec<u64> = comm
        .allgather_bytes(&host.to_le_bytes())
        .map_err(|e| e.to_string())?
        .iter()
        .map(|b| b.as_slice().try_into().map(u64::from_le_bytes))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("a host key: {e}"))?;
    let layout = HostLayout::new(&hosts, rank).map_err(|e| e.to_string())?;
    for len in LENGTHS {
        for op in [ReduceOp::Sum, ReduceOp::Average] {
            for direct in [false, true] {
                check::<f32>(&mut comm, &layout, len, op, direct)?;
                check::<i64>(&mut comm, &layout, len, op, direct)?;
            }
        }
    }
    comm.control_barrier().map_err(|e| e.to_string())
}

/// Rank `r`'s input: small integers, so that f32 sums are exact in any
/// order.
fn input<T: Element + From<i16>>(rank: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from(((i * 7 + rank * 131) % 201) as i16 - 100))
        .collect()
}

/// One allreduce of `len` elements, through the communicator or the
/// algorithm itself (`direct`), against the sum computed here.
fn check<T: Element + From<i16>>(
    comm: &mut UcxComm,
    layout: &HostLayout,
    len: usize,
    op: ReduceOp,
    direct: bool,
) -> Result<(), String> {
    let (rank, size) = (comm.rank(), comm.size());
    let mut buf = input::<T>(rank, len);
    let result = if direct {
        hierarchical_allreduce(comm, layout, &mut buf, op, Scale::NONE)
    } else {
        comm.allreduce(&mut buf[..], op, Scale::NONE)
    };
    let what = format!(
        "rank {rank}: {len} {:?} {op:?} ({})",
        T::DTYPE,
        if direct { "direct" } else { "comm" }
    );
    result.map_err(|e| format!("{what}: {e}"))?;
    let mut want = vec![T::identity(op); len];
    for r in 0..size {
        T::reduce_into(&mut want, &input::<T>(r, len), op);
    }
    T::scale(&mut want, Scale::NONE.postscale_for(op, size));
    match (0..len).find(|&i| buf[i] != want[i]) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {:?}, expected {:?}",
            buf[i], want[i]
        )),
    }
}
