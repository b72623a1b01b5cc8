//! `cargo xtask bench mpi`: kolo over MPI against plain MPI, in the same
//! run. kolo-bench built with the `mpi` feature runs `--backend mpi
//! --compare` under `mpirun -np N` for each process count: in every
//! iteration of every size kolo's `MpiComm` allreduce and a plain in-place
//! `MPI_Allreduce` run on identical buffers with the same timing,
//! alternating which goes first; then the whole sweep again through the
//! kolo engine (one tensor per step). The summary gives, per process
//! count, kolo direct against plain MPI at 1 MiB and above, and the
//! engine's extra cost per operation at 8 B and 1 MiB.

use super::flags::{Flag, Flags, OUT};
use super::runner::{build_kolo_bench, Session};
use super::Sweep;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const SWEEP: Sweep = Sweep {
    name: "mpi",
    about: "kolo-mpi direct and through the engine against plain MPI_Allreduce, mpirun -np 2 and 4",
    flags: &[
        Flag {
            name: "--np",
            value: Some("N,N"),
            help: "process counts, comma-separated (default 2,4)",
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
        Flag {
            name: "--op",
            value: Some("OPS"),
            help: "kolo-bench's --op: allreduce (default), a list, or all",
        },
        Flag {
            name: "--dtype",
            value: Some("TYPE"),
            help: "element type (default f32)",
        },
        SINGLE_COPY,
        Flag {
            name: "--yield",
            value: Some("auto|0|1"),
            help: "OpenMPI's mpi_yield_when_idle (default auto: 1 when np > cores)",
        },
        OUT,
    ],
    run,
};

/// `--single-copy`, shared with `threads-vs-mpi`.
pub(crate) const SINGLE_COPY: Flag = Flag {
    name: "--single-copy",
    value: Some("none|cma"),
    help: "vader's single-copy mechanism (default none: ptrace is often forbidden in containers)",
};

/// `mpirun -np np` with the flags of kolo-mpi's launcher (docs/mpi.md):
/// root allowed, oversubscription allowed, no process binding, shared
/// memory and loopback TCP only, and vader's `single_copy` mechanism (kolo
/// and plain MPI share the setting, so comparisons stay fair).
pub(crate) fn mpirun(np: usize, single_copy: &str, yield_when_idle: bool) -> Command {
    let mut command = Command::new("mpirun");
    command
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", single_copy)
        .env("OMPI_MCA_btl", "self,vader,tcp")
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .env(
            "OMPI_MCA_mpi_yield_when_idle",
            if yield_when_idle { "1" } else { "0" },
        )
        .args([
            "-np",
            &np.to_string(),
            "--oversubscribe",
            "--bind-to",
            "none",
        ]);
    command
}

/// Makes sure `mpirun` and `mpicc` are installed, running
/// scripts/install-deps.sh (as `cargo xtask test` does) when they are not.
pub(crate) fn ensure_mpi(root: &Path) -> Result<()> {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
    };
    if on_path("mpirun") && on_path("mpicc") {
        return Ok(());
    }
    let script = root.join("scripts/install-deps.sh");
    eprintln!("xtask: mpirun or mpicc missing; bash {}", script.display());
    let status = Command::new("bash")
        .arg(&script)
        .current_dir(root)
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    let installed = || on_path("mpirun") && on_path("mpicc");
    if !(status.success() && installed()) {
        bail!(
            "mpirun and mpicc are needed: {} did not install them ({status})",
            script.display()
        );
    }
    Ok(())
}

fn run(root: &Path, flags: &Flags, out: PathBuf) -> Result<()> {
    let iters = flags.count("--iters", 20)?;
    let warmup: usize = flags.value("--warmup", 5)?;
    let nps = process_counts(flags.text("--np").unwrap_or("2,4"))?;
    let single_copy = flags.text("--single-copy").unwrap_or("none").to_string();
    let yield_mode = flags.text("--yield").unwrap_or("auto");
    if !["auto", "0", "1"].contains(&yield_mode) {
        bail!("--yield {yield_mode:?}: expected auto, 0 or 1");
    }
    let dtype = flags.text("--dtype").unwrap_or("f32").to_string();
    ensure_mpi(root)?;
    let bench = build_kolo_bench(root, &["mpi"])?.kolo_bench;
    let mut session = Session::open(out, false)?;
    let version = Command::new("mpirun")
        .arg("--version")
        .output()
        .context("running mpirun --version")?;
    let version = String::from_utf8_lossy(&version.stdout);
    session.say(&format!("# {}", version.lines().next().unwrap_or("mpirun")))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut summary = vec![format!(
        "# {dtype} sum; median of the slowest rank; kolo and plain MPI in the same run per process count"
    )];
    for np in nps {
        let yield_when_idle = match yield_mode {
            "auto" => np > cores,
            mode => mode == "1",
        };
        session.say(&format!(
            "\n## mpirun -np {np} (mpi_yield_when_idle={})",
            u8::from(yield_when_idle)
        ))?;
        let mut command = mpirun(np, &single_copy, yield_when_idle);
        command.arg(&bench).args(["--backend", "mpi", "--compare"]);
        for (flag, default) in [
            ("--op", "allreduce"),
            ("--min-bytes", "8"),
            ("--max-bytes", "64M"),
        ] {
            command.args([flag, flags.text(flag).unwrap_or(default)]);
        }
        command.args(["--dtype", &dtype]);
        command.args([
            "--iters",
            &iters.to_string(),
            "--warmup",
            &warmup.to_string(),
        ]);
        command.arg("--quiet");
        let stdout = session.stream(command, &format!("np{np}.txt"))?;
        summary.extend(summarise(np, &stdout));
    }
    session.finish(&summary.join("\n"))
}

fn process_counts(text: &str) -> Result<Vec<usize>> {
    text.split(',')
        .map(|n| match n.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => bail!("--np {text:?}: expected process counts like 2,4"),
        })
        .collect()
}

/// One line of kolo-bench's same-run comparison table.
#[derive(Debug, PartialEq)]
struct Compared {
    size: usize,
    mpi_us: Option<f64>,
    direct_us: Option<f64>,
    vs_mpi: Option<String>,
    engine_us: Option<f64>,
    engine_extra: Option<String>,
}

/// The allreduce lines of the comparison table that ends kolo-bench's
/// output (columns: op, size, MPI, direct, vs MPI %, engine,
/// engine-direct; `-` where not measured).
fn comparison(stdout: &str) -> Vec<Compared> {
    let number = |f: &str| f.parse::<f64>().ok();
    let text = |f: &str| (f != "-").then(|| f.to_string());
    stdout
        .lines()
        .skip_while(|line| !line.starts_with("# same-run comparison"))
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == 7 && f[0] == "allreduce")
        .filter_map(|f| {
            Some(Compared {
                size: f[1].parse().ok()?,
                mpi_us: number(f[2]),
                direct_us: number(f[3]),
                vs_mpi: text(f[4]),
                engine_us: number(f[5]),
                engine_extra: text(f[6]),
            })
        })
        .collect()
}

fn summarise(np: usize, stdout: &str) -> Vec<String> {
    const MIB: usize = 1 << 20;
    let mut lines = Vec::new();
    for c in comparison(stdout) {
        if let (true, Some(direct), Some(mpi), Some(pct)) =
            (c.size >= MIB, c.direct_us, c.mpi_us, &c.vs_mpi)
        {
            lines.push(format!(
                "np {np} {:>9} B: kolo direct {direct:10.2} us, plain MPI_Allreduce {mpi:10.2} us: {pct}%",
                c.size
            ));
        }
        if let (true, Some(engine), Some(direct), Some(extra)) = (
            c.size == 8 || c.size == MIB,
            c.engine_us,
            c.direct_us,
            &c.engine_extra,
        ) {
            lines.push(format!(
                "np {np} {:>9} B: engine {engine:10.2} us - direct {direct:10.2} us = {extra} us per operation",
                c.size
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "\
# allreduce: mpi backend, 2 ranks
     1048576        262144    f32     sum      248.80    4.214    4.214       0
# same-run comparison (median of the slowest rank, us; vs MPI: kolo direct relative to plain MPI_Allreduce, + is slower)
#           op     size (B)        MPI     direct  vs MPI %     engine engine-direct
     allreduce            8       0.70       1.10    +57.14      22.00        +20.90
     allreduce      1048576     250.10     248.80     -0.52     461.80       +213.00
     allreduce      2097152     576.40     557.00     -3.37          -             -
     broadcast      1048576          -     100.00         -     120.00        +20.00
";

    #[test]
    fn the_comparison_table_is_read_back() {
        let rows = comparison(OUTPUT);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].size, 1 << 20);
        assert_eq!(rows[1].mpi_us, Some(250.1));
        assert_eq!(rows[2].engine_us, None);
        assert_eq!(rows[2].engine_extra, None);
        let lines = summarise(2, OUTPUT);
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(lines[0].contains("8 B: engine      22.00 us - direct       1.10 us = +20.90 us"));
        assert!(lines[1].contains(
            "1048576 B: kolo direct     248.80 us, plain MPI_Allreduce     250.10 us: -0.52%"
        ));
        assert!(lines[2].contains("1048576 B: engine     461.80 us"));
        assert!(lines[3].contains("2097152 B: kolo direct"));
    }

    #[test]
    fn process_counts_are_checked() {
        assert_eq!(process_counts("2,4").unwrap(), [2, 4]);
        assert_eq!(process_counts(" 3 ").unwrap(), [3]);
        assert!(process_counts("2,x")
            .unwrap_err()
            .to_string()
            .contains("--np \"2,x\""));
        assert!(process_counts("0").is_err());
    }

    #[test]
    fn mpirun_carries_the_launcher_settings() {
        let command = mpirun(4, "none", true);
        let args: Vec<_> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args, ["-np", "4", "--oversubscribe", "--bind-to", "none"]);
        let env: Vec<_> = command
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        assert!(env.contains(&("OMPI_MCA_mpi_yield_when_idle".into(), Some("1".into()))));
        assert!(env.contains(&(
            "OMPI_MCA_btl_vader_single_copy_mechanism".into(),
            Some("none".into())
        )));
    }
}
