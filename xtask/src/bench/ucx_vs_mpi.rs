//! `cargo xtask bench ucx-vs-mpi`: kolo-ucx's allreduce beside OpenMPI's
//! `MPI_Allreduce` on this machine, in the same run: rounds alternate
//! which goes first, and each round runs both over the same sizes with the
//! same timing (benches/mpi-baseline/allreduce.c's, which kolo-bench
//! shares). kolo-ucx runs under `kolo-run -n N` with `UCX_TLS` set to the
//! chosen transports; OpenMPI runs with the matching BTLs (shared memory:
//! `self,vader` with the single-copy mechanism of `--single-copy`; TCP:
//! `self,tcp` over loopback; `netns`: TCP across two network namespaces
//! the sweep makes, joined by a veth pair, half the ranks in each, removed
//! afterwards; needs root). The summary is per size the median over
//! rounds of kolo-ucx / MPI: busbw for the large sizes, time for 8 B.

use super::flags::{Flag, Flags, OUT};
use super::mpi::{ensure_mpi, mpirun, SINGLE_COPY};
use super::runner::{build_kolo_bench, row_value, target_dir, Session};
use super::stats::{median, median_ratio};
use super::threads_vs_mpi::build_baseline;
use super::Sweep;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const SWEEP: Sweep = Sweep {
    name: "ucx-vs-mpi",
    about:
        "kolo-ucx allreduce (kolo-run) against plain MPI_Allreduce, 8 B and 1-64 MiB, interleaved",
    flags: &[
        Flag {
            name: "--ranks",
            value: Some("N"),
            help: "processes (default 2)",
        },
        Flag {
            name: "--tls",
            value: Some("sm|tcp|netns"),
            help: "shared memory (default), TCP over loopback, or TCP across two network namespaces (root; even --ranks)",
        },
        Flag {
            name: "--rounds",
            value: Some("N"),
            help: "interleaved rounds (default 5)",
        },
        Flag {
            name: "--iters",
            value: Some("N"),
            help: "timed iterations per size (default 20)",
        },
        SINGLE_COPY,
        OUT,
    ],
    run,
};

/// The sizes compared: latency at the first, bus bandwidth at the others.
const LATENCY: usize = 8;
const BANDWIDTH: [usize; 3] = [1 << 20, 16 << 20, 64 << 20];
/// Columns of a table row (0-based): time (µs) and busbw (GB/s).
const TIME: usize = 4;
const BUSBW: usize = 6;

/// One side's numbers in one round: the 8 B time, then busbw per size.
type Numbers = (f64, [f64; 3]);

/// Where the ranks run and over what.
enum Mode {
    SharedMemory,
    Loopback,
    Namespaces(Namespaces),
}

fn run(root: &Path, flags: &Flags, out: PathBuf) -> Result<()> {
    let ranks = flags.count("--ranks", 2)?;
    let rounds = flags.count("--rounds", 5)?;
    let iters = flags.count("--iters", 20)?.to_string();
    let single_copy = flags.text("--single-copy").unwrap_or("cma").to_string();
    let mode = match flags.text("--tls").unwrap_or("sm") {
        "sm" => Mode::SharedMemory,
        "tcp" => Mode::Loopback,
        "netns" if ranks % 2 == 0 => Mode::Namespaces(Namespaces::make()?),
        "netns" => {
            bail!("--tls netns puts half the ranks in each namespace: --ranks {ranks} is odd")
        }
        other => bail!("--tls {other:?}: expected sm, tcp or netns"),
    };
    ensure_mpi(root)?;
    let bench = build_kolo_bench(root, &["ucx"])?.kolo_bench;
    let kolo_run = build_kolo_run(root)?;
    let baseline = build_baseline(root)?;
    let mut session = Session::open(out.clone(), false)?;
    let tls = match mode {
        Mode::SharedMemory => "sm,self",
        _ => "tcp,self",
    };
    let where_ = match &mode {
        Mode::Namespaces(ns) => format!(
            ", across namespaces {} ({}) and {} ({})",
            ns.names[0], ns.addresses[0], ns.names[1], ns.addresses[1]
        ),
        _ => String::new(),
    };
    session.say(&format!(
        "# {ranks} processes{where_}; kolo-ucx with UCX_TLS={tls}; OpenMPI with btl {}",
        if tls == "sm,self" {
            "self,vader"
        } else {
            "self,tcp"
        }
    ))?;
    session.say("# round: 8 B time (us), then busbw (GB/s) at 1, 16, 64 MiB; ucx | mpi")?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let agent = match &mode {
        Mode::Namespaces(_) => Some(write_agent(&out)?),
        _ => None,
    };

    let mut ucx_all = Vec::new();
    let mut mpi_all = Vec::new();
    for round in 1..=rounds {
        let ucx_side = |session: &mut Session| -> Result<Numbers> {
            let mut text = String::new();
            for (min, max) in SWEEPS {
                let args = |command: &mut Command| {
                    command
                        .env("UCX_TLS", tls)
                        .arg(&bench)
                        .args(["--backend", "ucx", "--op", "allreduce", "--dtype", "f32"])
                        .args(["--min-bytes", min, "--max-bytes", max, "--factor", "4"])
                        .args(["--iters", &iters, "--warmup", "5", "--quiet"]);
                };
                let file = format!("ucx-{round}-{min}.txt");
                let Mode::Namespaces(ns) = &mode else {
                    let mut command = Command::new(&kolo_run);
                    command.args(["-n", &ranks.to_string(), "--master-port", "0"]);
                    args(&mut command);
                    text.push_str(&session.stream(command, &file)?);
                    continue;
                };
                // Node 1 in the second namespace, its output kept apart;
                // node 0 (with rank 0, which prints the table) in the first.
                let node = |n: usize| {
                    let mut command = Command::new("ip");
                    command
                        .args(["netns", "exec", &ns.names[n]])
                        .arg(&kolo_run)
                        .args(["--nnodes", "2", "--node-rank", &n.to_string()])
                        .args(["--master-addr", &ns.addresses[0], "--master-port", "29611"])
                        .args(["--token", "ucx-vs-mpi", "-n", &(ranks / 2).to_string()]);
                    args(&mut command);
                    command
                };
                let second =
                    std::fs::File::create(out.join(format!("ucx-{round}-{min}-node1.txt")))?;
                let mut second = node(1)
                    .stdout(second.try_clone()?)
                    .stderr(second)
                    .spawn()
                    .context("starting kolo-run in the second namespace")?;
                let first = session.stream(node(0), &file);
                let status = second.wait().context("waiting for the second namespace")?;
                text.push_str(&first?);
                if !status.success() {
                    bail!("kolo-run in {} failed ({status})", ns.names[1]);
                }
            }
            numbers(&text, "kolo-ucx")
        };
        let mpi_side = |session: &mut Session| -> Result<Numbers> {
            let mut text = String::new();
            for (min, max) in SWEEPS {
                let mut command = mpirun(ranks, &single_copy, ranks > cores);
                match &mode {
                    Mode::SharedMemory => {
                        command.env("OMPI_MCA_btl", "self,vader");
                    }
                    Mode::Loopback => {
                        command.env("OMPI_MCA_btl", "self,tcp");
                    }
                    Mode::Namespaces(ns) => {
                        let subnet = format!("{}/24", ns.addresses[0]);
                        let per = ranks / 2;
                        let hosts = format!("{}:{per},{}:{per}", ns.addresses[0], ns.addresses[1]);
                        let inner = command;
                        command = Command::new("ip");
                        command.args(["netns", "exec", &ns.names[0]]);
                        command.arg(inner.get_program()).args(inner.get_args());
                        for (key, value) in inner.get_envs() {
                            if let Some(value) = value {
                                command.env(key, value);
                            }
                        }
                        command
                            .env("OMPI_MCA_btl", "self,tcp")
                            .env("OMPI_MCA_btl_tcp_if_include", &subnet)
                            .env("OMPI_MCA_oob_tcp_if_include", &subnet)
                            .env("OMPI_MCA_plm_rsh_agent", agent.as_ref().expect("written"))
                            .args(["--host", &hosts]);
                    }
                }
                command.arg(&baseline).args([min, max, "4", &iters, "5"]);
                text.push_str(&session.stream(command, &format!("mpi-{round}-{min}.txt"))?);
            }
            numbers(&text, "the MPI baseline")
        };
        let (ucx, mpi) = if round % 2 == 1 {
            let u = ucx_side(&mut session)?;
            (u, mpi_side(&mut session)?)
        } else {
            let m = mpi_side(&mut session)?;
            (ucx_side(&mut session)?, m)
        };
        session.say(&format!(
            "{round}: {:.2} {:.3} {:.3} {:.3} | {:.2} {:.3} {:.3} {:.3}",
            ucx.0, ucx.1[0], ucx.1[1], ucx.1[2], mpi.0, mpi.1[0], mpi.1[1], mpi.1[2]
        ))?;
        ucx_all.push(ucx);
        mpi_all.push(mpi);
    }
    let what = format!("{tls}{where_}");
    session.finish(&summary(ranks, &what, &ucx_all, &mpi_all))
}

/// The two sweeps of a side: the latency size, then the bandwidth sizes.
const SWEEPS: [(&str, &str); 2] = [("8", "8"), ("1M", "64M")];

/// Two network namespaces joined by a veth pair, with addresses of their
/// own (10.79.x.1 and .2), named after this process; removed on drop.
struct Namespaces {
    names: [String; 2],
    addresses: [String; 2],
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("running ip {} (iproute2 is needed)", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ip {}: {} (--tls netns needs root)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Namespaces {
    fn make() -> Result<Namespaces> {
        let id = std::process::id() % 100_000;
        let subnet = 1 + id % 250;
        let ns = Namespaces {
            names: [format!("kolob{id}a"), format!("kolob{id}b")],
            addresses: [format!("10.79.{subnet}.1"), format!("10.79.{subnet}.2")],
        };
        let devices = [format!("kb{id}a"), format!("kb{id}b")];
        for name in &ns.names {
            ip(&["netns", "add", name])?;
        }
        ip(&[
            "link",
            "add",
            &devices[0],
            "type",
            "veth",
            "peer",
            "name",
            &devices[1],
        ])?;
        for ((name, dev), address) in ns.names.iter().zip(&devices).zip(&ns.addresses) {
            ip(&["link", "set", dev, "netns", name])?;
            let address = format!("{address}/24");
            ip(&["-n", name, "addr", "add", &address, "dev", dev])?;
            ip(&["-n", name, "link", "set", dev, "up"])?;
            ip(&["-n", name, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // A namespace takes its end of the veth pair with it, and the
        // pair goes with either end.
        for name in &self.names {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// OpenMPI's `plm_rsh_agent` for namespaces: called as `agent HOST
/// COMMAND...` with HOST one of the namespaces' addresses, it runs the
/// command in the namespace that holds the address.
fn write_agent(out: &Path) -> Result<PathBuf> {
    let path = out.join("netns-agent.sh");
    let script = r#"#!/bin/sh
host=$1; shift
for ns in $(ip netns list | cut -d' ' -f1); do
  if ip -n "$ns" -4 addr | grep -q "inet $host/"; then
    exec ip netns exec "$ns" sh -c "$*"
  fi
done
echo "netns-agent: no namespace holds $host" >&2
exit 1
"#;
    std::fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// Builds kolo-run in release mode and returns its path.
fn build_kolo_run(root: &Path) -> Result<PathBuf> {
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "-p", "kolo-run"])
        .current_dir(root)
        .status()
        .context("running cargo build -p kolo-run")?;
    if !status.success() {
        bail!("cargo build --release -p kolo-run failed ({status})");
    }
    Ok(target_dir(root)?.join("release").join("kolo-run"))
}

fn numbers(text: &str, what: &str) -> Result<Numbers> {
    let get = |bytes: usize, column: usize| {
        row_value(text, bytes, column)
            .with_context(|| format!("{what} printed no row of {bytes} B:\n{text}"))
    };
    Ok((
        get(LATENCY, TIME)?,
        [
            get(BANDWIDTH[0], BUSBW)?,
            get(BANDWIDTH[1], BUSBW)?,
            get(BANDWIDTH[2], BUSBW)?,
        ],
    ))
}

fn summary(ranks: usize, what: &str, ucx: &[Numbers], mpi: &[Numbers]) -> String {
    let mut lines = vec![format!(
        "kolo-ucx / MPI_Allreduce, {ranks} processes, UCX_TLS={what}, f32 sum, medians of {} rounds",
        ucx.len()
    )];
    let (u, m): (Vec<f64>, Vec<f64>) = (
        ucx.iter().map(|n| n.0).collect(),
        mpi.iter().map(|n| n.0).collect(),
    );
    lines.push(format!(
        "{LATENCY:>9} B: ucx {:8.2} us, MPI {:8.2} us, time ratio {:5.2}x (at most 1.2x wanted)",
        median(&u),
        median(&m),
        median_ratio(&m, &u)
    ));
    for (i, size) in BANDWIDTH.iter().enumerate() {
        let u: Vec<f64> = ucx.iter().map(|n| n.1[i]).collect();
        let m: Vec<f64> = mpi.iter().map(|n| n.1[i]).collect();
        lines.push(format!(
            "{size:>9} B: ucx {:8.3} GB/s, MPI {:8.3} GB/s, busbw ratio {:5.2}x (at least 1.0x wanted)",
            median(&u),
            median(&m),
            median_ratio(&m, &u)
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_takes_medians_of_per_round_ratios() {
        let ucx = [
            (1.0, [2.0, 4.0, 4.0]),
            (2.0, [2.0, 4.0, 8.0]),
            (1.0, [1.0, 4.0, 4.0]),
        ];
        let mpi = [
            (1.0, [1.0, 4.0, 4.0]),
            (1.0, [1.0, 8.0, 4.0]),
            (2.0, [1.0, 2.0, 4.0]),
        ];
        let text = summary(2, "sm,self", &ucx, &mpi);
        assert!(
            text.contains("8 B: ucx     1.00 us, MPI     1.00 us, time ratio  1.00x"),
            "{text}"
        );
        assert!(
            text.contains("1048576 B: ucx    2.000 GB/s, MPI    1.000 GB/s, busbw ratio  2.00x"),
            "{text}"
        );
        assert!(
            text.contains("16777216 B: ucx    4.000 GB/s, MPI    4.000 GB/s, busbw ratio  1.00x"),
            "{text}"
        );
        let row =
            "    16777216       4194304    f32     sum     2000.00    8.389   12.000       0\n";
        let text = format!(
            "       8             2    f32     sum        0.50    0.016    0.016       0\n{row}"
        );
        assert!(numbers(&text, "x")
            .unwrap_err()
            .to_string()
            .contains("no row of 1048576 B"));
    }
}
