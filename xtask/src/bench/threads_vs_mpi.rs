//! `cargo xtask bench threads-vs-mpi`: kolo's threads backend beside
//! OpenMPI's `MPI_Allreduce` on this machine, in the same run: f32 sum,
//! the same sizes, iterations and timing (warm-up, a barrier, then timed
//! calls back to back, the input restored untimed before each; median over
//! iterations of the slowest rank). kolo-bench runs the threads, and
//! benches/mpi-baseline/allreduce.c, built with mpicc, runs plain MPI; the
//! summary is busbw kolo / MPI at 16 MiB and 64 MiB.

use super::flags::{Flag, Flags, OUT};
use super::mpi::{ensure_mpi, mpirun, SINGLE_COPY};
use super::runner::{build_kolo_bench, row_value, target_dir, Session};
use super::Sweep;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const SWEEP: Sweep = Sweep {
    name: "threads-vs-mpi",
    about:
        "kolo-threads allreduce against plain MPI_Allreduce (benches/mpi-baseline), 8 B to 64 MiB",
    flags: &[
        Flag {
            name: "--ranks",
            value: Some("N"),
            help: "ranks: threads for kolo, processes for MPI (default 2)",
        },
        Flag {
            name: "--iters",
            value: Some("N"),
            help: "timed iterations per size (default 20)",
        },
        Flag {
            name: "--warmup",
            value: Some("N"),
            help: "untimed iterations before them (default 5)",
        },
        Flag {
            name: "--min-bytes",
            value: Some("SIZE"),
            help: "smallest size, K/M/G suffixes (default 8)",
        },
        Flag {
            name: "--max-bytes",
            value: Some("SIZE"),
            help: "largest size (default 64M)",
        },
        SINGLE_COPY,
        OUT,
    ],
    run,
};

/// The sizes the summary compares (busbw is column 7 of a row).
const COMPARED: [usize; 2] = [16 << 20, 64 << 20];
const BUSBW: usize = 6;

fn run(root: &Path, flags: &Flags, out: PathBuf) -> Result<()> {
    let ranks = flags.count("--ranks", 2)?;
    let iters = flags.count("--iters", 20)?;
    let warmup: usize = flags.value("--warmup", 5)?;
    let min = flags.text("--min-bytes").unwrap_or("8").to_string();
    let max = flags.text("--max-bytes").unwrap_or("64M").to_string();
    let single_copy = flags.text("--single-copy").unwrap_or("none").to_string();
    ensure_mpi(root)?;
    let bench = build_kolo_bench(root, &[])?.kolo_bench;
    let baseline = build_baseline(root)?;
    let mut session = Session::open(out, false)?;

    let mut kolo = Command::new(&bench);
    kolo.args(["--backend", "threads", "--ranks", &ranks.to_string()])
        .args(["--op", "allreduce", "--dtype", "f32"])
        .args(["--min-bytes", &min, "--max-bytes", &max])
        .args([
            "--iters",
            &iters.to_string(),
            "--warmup",
            &warmup.to_string(),
        ])
        .arg("--quiet");
    let kolo = session.stream(kolo, "kolo.txt")?;
    session.say("")?;

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut mpi = mpirun(ranks, &single_copy, ranks > cores);
    mpi.arg(&baseline)
        .args([&min, &max, "2", &iters.to_string(), &warmup.to_string()]);
    let mpi = session.stream(mpi, "mpi.txt")?;
    session.finish(&summary(ranks, &kolo, &mpi, &max))
}

/// Builds benches/mpi-baseline/allreduce.c into the target directory.
pub(crate) fn build_baseline(root: &Path) -> Result<PathBuf> {
    let dir = target_dir(root)?.join("mpi-baseline");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let binary = dir.join("allreduce");
    let source = root.join("benches/mpi-baseline/allreduce.c");
    eprintln!(
        "xtask: mpicc -O2 -o {} {}",
        binary.display(),
        source.display()
    );
    let status = Command::new("mpicc")
        .arg("-O2")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .status()
        .context("running mpicc")?;
    if !status.success() {
        bail!("mpicc failed on {} ({status})", source.display());
    }
    Ok(binary)
}

fn summary(ranks: usize, kolo: &str, mpi: &str, max: &str) -> String {
    let mut lines = vec![format!(
        "busbw kolo threads / MPI_Allreduce, {ranks} ranks, f32 sum"
    )];
    for size in COMPARED {
        match (row_value(kolo, size, BUSBW), row_value(mpi, size, BUSBW)) {
            (Some(k), Some(m)) => {
                let ratio = if m > 0.0 { k / m } else { 0.0 };
                lines.push(format!(
                    "{size:>9} B: kolo {k:8.3} GB/s, MPI {m:8.3} GB/s, ratio {ratio:6.2}x"
                ));
            }
            _ => lines.push(format!(
                "{size:>9} B: not in both sweeps (--max-bytes {max})"
            )),
        }
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_compares_busbw_at_16_and_64_mib() {
        let kolo =
            "    16777216       4194304    f32     sum     2000.00    8.389   12.000       0\n";
        let mpi = "# allreduce: mpi (MPI_Allreduce, in place), 2 ranks\n    16777216       4194304    f32     sum     6000.00    2.796    4.000       0\n";
        let text = summary(2, kolo, mpi, "16M");
        assert!(
            text.contains("16777216 B: kolo   12.000 GB/s, MPI    4.000 GB/s, ratio   3.00x"),
            "{text}"
        );
        assert!(
            text.ends_with("67108864 B: not in both sweeps (--max-bytes 16M)"),
            "{text}"
        );
    }
}
